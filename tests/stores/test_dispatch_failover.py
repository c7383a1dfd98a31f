"""Two `backchannel serve` processes on one store (PostgreSQL, or one SQLite file), both
running the push dispatcher:
a webhook member is pushed by one hub at a time, and when that hub is killed with
SIGKILL in the middle of a stream the other takes the member over. Every accepted message
is pushed, in send order; a repeat is only a copy the dead hub held and never acked.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backchannel.testing import eventually_blocking
from tests.conftest import Server, start_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LEASE_S = 5.0  # --dispatch-lease (its floor): a dead hub's members move within about this long
N = 400  # messages in the stream
TAKE_S = 0.01  # the receiver's time per push: slower than the sender, so a backlog builds


@dataclass
class Receiver:
    """A webhook service that takes every push and records it."""

    url: str = ""
    # (monotonic time, message id, attempt, client port: which connection pushed it)
    got: list[tuple[float, str, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ids(self) -> list[str]:
        with self.lock:
            return [mid for _, mid, _, _ in self.got]


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: one connection per pushing hub

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            time.sleep(TAKE_S)  # a receiver with work to do per message
            with rec.lock:
                rec.got.append((
                    time.monotonic(),
                    self.headers["X-Backchannel-Message-Id"],
                    int(self.headers["X-Backchannel-Attempt"]),
                    self.client_address[1],
                ))  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    class Quiet(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # the killed hub's connection is reset under its handler: expected

    httpd = Quiet(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def start_two_hubs(
    base: Path, url: str, service_url: str, *args: str, config: str | None = None
) -> list[Server]:
    """Two hubs on one database with one admin token and the same callback registry (as
    an operator configures every host alike), each with ``config`` as its ``config.yaml``
    and ``args`` after its own; the push lease is short for the test."""
    token = "bca_" + secrets.token_urlsafe(32)
    homes = []
    for i in range(2):
        home = base / f"hub{i}"
        home.mkdir(parents=True)
        fd = os.open(home / "admin.token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        if config is not None:
            (home / "config.yaml").write_text(config)
        homes.append(home)
    env = {"BACKCHANNEL_CALLBACKS": f"sink={service_url}"}
    argv = ("--dispatch-lease", str(LEASE_S), *args)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_server, h, url, *argv, env=env) for h in homes]
        return [f.result() for f in futures]


def team_with_sink(hub: Server) -> str:
    """Team ``po`` with its member ``sink`` pushed to by webhook (the service ``sink``);
    returns the team's ``user`` token."""
    with hub.client() as c:
        r = c.post("/v1/teams", json={"name": "po"})
        assert r.status_code == 201, r.text
        user_token = str(r.json()["user_token"])
        r = c.post(
            "/v1/teams/po/members",
            json={
                "name": "sink",
                "kind": "http",
                "delivery": {"type": "webhook", "service": "sink"},
            },
        )
        assert r.status_code == 201, r.text
    return user_token


def rows(url: str, sql: str) -> list[Any]:
    """Rows of a query (no parameters) straight from the store's database."""
    if url.startswith("sqlite://"):
        conn = sqlite3.connect(url.removeprefix("sqlite://"), timeout=30)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        return pg.execute(sql).fetchall()


def owner_pid(url: str) -> int | None:
    """The process id of the hub that holds the push lease on po/sink (owner names are
    ``host/pid/random``)."""
    got = rows(url, "SELECT owner FROM dispatch_owners WHERE team = 'po' AND member = 'sink'")
    return int(got[0][0].split("/")[1]) if got else None


def history(url: str) -> dict[str, list[tuple[str, str]]]:
    events = rows(
        url,
        "SELECT message_id, event, detail FROM delivery_events "
        "WHERE team = 'po' AND member = 'sink' ORDER BY id",
    )
    out: dict[str, list[tuple[str, str]]] = {}
    for mid, event, detail in events:
        out.setdefault(mid, []).append((event, detail))
    return out


@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
def test_kill_9_of_the_owning_hub_mid_stream_the_other_pushes_everything_in_order(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if kind == "postgres":
        url = request.getfixturevalue("new_postgres_url")()
    else:
        url = f"sqlite://{tmp_path / 'shared.db'}"
    with webhook_receiver() as rec:
        hubs = start_two_hubs(tmp_path, url, rec.url)
        try:
            user_token = team_with_sink(hubs[0])
            # both hubs scan; exactly one of them takes the member
            pid = eventually_blocking(
                lambda: owner_pid(url), within=15, what="a hub to own po/sink"
            )
            owner = next(h for h in hubs if h.proc.pid == pid)
            other = next(h for h in hubs if h is not owner)

            accepted: list[str] = []
            failed: list[str] = []

            def stream() -> None:
                # one sender through the hub that survives, so send order is one order
                with other.client(user_token) as c:
                    for i in range(N):
                        mid = f"m{i:04}"
                        r = c.post(
                            "/v1/messages",
                            json={"to": "sink", "text": f"n{i}", "link": False, "message_id": mid},
                        )
                        (accepted if r.status_code == 201 else failed).append(mid)
                        time.sleep(0.005)  # pace the stream so it runs across the failover

            sender = threading.Thread(target=stream)
            sender.start()
            try:
                eventually_blocking(
                    lambda: len(rec.ids()) >= N // 5, within=30, what="the owner to push a fifth"
                )
                owner.kill()  # SIGKILL, in the middle of the stream
                killed_at = time.monotonic()
                pushed_before_kill = len(rec.ids())
            finally:
                sender.join(60)
            assert not sender.is_alive()
            assert not failed, f"sends refused: {failed[:3]}"
            assert len(accepted) == N

            want = set(accepted)
            eventually_blocking(
                lambda: want <= set(rec.ids()), within=30, what="every accepted message pushed"
            )
            assert owner_pid(url) == other.proc.pid, "the survivor owns the member now"

            # nothing is left queued or leased: each copy is acked after its push, or
            # `delivered` (the dead hub recorded the push and died before its ack)
            eventually_blocking(
                lambda: not _states(url) - {"acked", "delivered"}, within=30, what="every copy done"
            )

            with rec.lock:
                got = list(rec.got)
            first_seen = list(dict.fromkeys(mid for _, mid, _, _ in got))
            assert first_seen == accepted, "each message pushed, in send order"
            # the survivor's pushes come over its own connections; a request the dead hub
            # sent just before the kill may be recorded just after it
            dead_ports = {port for t, _, _, port in got if t <= killed_at}
            after = [t for t, _, _, port in got if t > killed_at and port not in dead_ports]
            assert after, "the survivor pushed after the kill"
            failover = after[0] - killed_at

            # a repeat is only a copy the dead hub held and never acked: the survivor put
            # it back in the queue when it took the member over, before any ack
            counts: dict[str, int] = {}
            for _, mid, _, _ in got:
                counts[mid] = counts.get(mid, 0) + 1
            repeats = sorted(m for m, n in counts.items() if n > 1)
            events = history(url)
            # (how many copies the dead hub held depends on where the kill landed; the
            # FakeClock tests in tests/delivery/test_dispatch_ownership.py pin that path)
            requeued = sum(
                1 for evs in events.values() for e, d in evs if e == "released" and "taken" in d
            )
            for mid in repeats:
                evs = events[mid]
                released = [i for i, (e, d) in enumerate(evs) if e == "released"]
                assert released, (mid, evs)
                assert "push delivery taken by" in evs[released[0]][1], (mid, evs)
                first_ack = next(i for i, (e, _) in enumerate(evs) if e == "acked")
                assert first_ack > released[0], f"{mid} was acked before it was repeated"
            print(
                f"\n{kind}: failover {failover:.2f} s from kill -9 to the survivor's first push "
                f"(--dispatch-lease {LEASE_S:g}); {pushed_before_kill} of {N} pushed before "
                f"the kill; {requeued} copies the dead hub held put back in the queue; "
                f"{len(repeats)} pushed twice"
            )
        finally:
            for h in hubs:
                h.stop()


def _states(url: str) -> set[str]:
    got = rows(url, "SELECT DISTINCT state FROM deliveries WHERE team = 'po' AND member = 'sink'")
    return {r[0] for r in got}
