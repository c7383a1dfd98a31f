"""A hub killed (SIGKILL) while it owns a member's push, with the push circuit in the store
(backchannel.delivery.circuit): two real `backchannel serve` processes on one PostgreSQL
database or one SQLite file, and a webhook target on 127.0.0.1 that hangs (down: every
attempt times out), answers, or holds a request it received until the test lets it go.

The owning hub is killed (a) while a probe of the down target is in flight (the target
answering again, or still down), (b) right
after the circuit opened, while it dead-letters the queue behind, (c) while a normal
push is in flight with the circuit closed and messages queued behind, (d) while the
probe that closes the circuit is being answered. Then the other hub takes the member
over once the lease runs out, and: every accepted message is delivered or dead-lettered
with its sender told; a message reaches the target more than once only as the copy the
dead hub was pushing, with the same ``Idempotency-Key`` each time (the webhook's
at-least-once contract, docs/decisions.md); the first pushes of the delivered messages
are in send order; the stored circuit ends closed, with no row left.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from backchannel.testing import eventually_blocking
from tests.conftest import Server
from tests.stores import test_dispatch_failover as failover
from tests.stores.test_dispatch_failover import owner_pid, rows, team_with_sink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

#: the callback retry policy: a hanging target costs half a second an attempt
RETRY = "retry: {start: 0.05, factor: 2, cap: 0.1, budget: 30, timeout: 0.5}\n"


@dataclass
class Target:
    """A webhook target. ``mode``: ``hang`` (down: holds each request past the hub's
    attempt timeout, then 503), ``ok`` (200), ``gate`` (records the request, sets
    ``arrived`` and answers 200 only once ``release`` is set)."""

    url: str = ""
    mode: str = "hang"
    # (message id, Idempotency-Key, attempt) of every request received, in order
    got: list[tuple[str, str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def ids(self) -> list[str]:
        with self.lock:
            return [mid for mid, _, _ in self.got]


@contextmanager
def target() -> Iterator[Target]:
    t = Target()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            mode = t.mode
            with t.lock:
                t.got.append((
                    self.headers["X-Backchannel-Message-Id"],
                    self.headers["Idempotency-Key"],
                    int(self.headers["X-Backchannel-Attempt"]),
                ))  # fmt: skip
            if mode == "hang":
                t.release.wait(2.0)  # past the hub's 0.5 s attempt timeout
                status = 503
            elif mode == "gate":
                t.arrived.set()
                t.release.wait(30)
                status = 200
            else:
                status = 200
            try:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except OSError:
                pass  # the hub that sent it is gone

        def log_message(self, *args: Any) -> None:
            pass

    class Quiet(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # the killed hub's connection is reset under its handler: expected

    httpd = Quiet(("127.0.0.1", 0), Handler)
    t.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield t
    finally:
        t.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def start_two_hubs(base: Path, url: str, service_url: str) -> list[Server]:
    """Two hubs on one store with a quick retry policy and two attempts a message."""
    return failover.start_two_hubs(base, url, service_url, "--max-attempts", "2", config=RETRY)


def circuit(url: str) -> str | None:
    got = rows(url, "SELECT state FROM push_circuits WHERE team = 'po' AND member = 'sink'")
    return str(got[0][0]) if got else None


def states(url: str) -> dict[str, str]:
    got = rows(
        url, "SELECT message_id, state FROM deliveries WHERE team = 'po' AND member = 'sink'"
    )
    return {str(mid): str(state) for mid, state in got}


def told(url: str) -> str:
    """Every system notice to the senders (``user``), as one text to search."""
    got = rows(url, "SELECT text, meta FROM messages WHERE team = 'po' AND to_name = 'user'")
    return "\n".join(f"{text} {meta}" for text, meta in got)


@pytest.mark.parametrize("case", ["probe", "still_down", "draining", "push", "closing"])
@pytest.mark.parametrize("kind", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
def test_kill_9_of_the_owner_with_the_circuit_in_the_store(
    kind: str, case: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if kind == "postgres":
        url = request.getfixturevalue("new_postgres_url")()
    else:
        url = f"sqlite://{tmp_path / 'shared.db'}"
    with target() as tg:
        if case == "push":
            tg.mode = "gate"
        hubs = start_two_hubs(tmp_path, url, tg.url)
        try:
            user_token = team_with_sink(hubs[0])
            pid = eventually_blocking(lambda: owner_pid(url), within=15, what="an owner of po/sink")
            owner = next(h for h in hubs if h.proc.pid == pid)
            other = next(h for h in hubs if h is not owner)
            accepted: list[str] = []

            def send(*mids: str) -> None:
                with other.client(user_token) as c:
                    for mid in mids:
                        r = c.post(
                            "/v1/messages",
                            json={"to": "sink", "text": mid, "link": False, "message_id": mid},
                        )
                        assert r.status_code == 201, r.text
                        accepted.append(mid)

            behind = 300 if case == "draining" else 4
            send(*(f"m{i:03}" for i in range(1 + behind)))
            if case == "push":
                # (c) the circuit is closed and m000 is in flight, the rest queued
                eventually_blocking(tg.arrived.is_set, within=15, what="m000 pushed")
                owner.kill()
                tg.mode = "ok"
                tg.release.set()
            elif case == "draining":
                # (b) m000 had its tries, the circuit opened: the queue behind is being
                # dead-lettered when the owner dies
                eventually_blocking(lambda: circuit(url), within=15, what="the circuit open")
                owner.kill()
                dead = sum(s == "dead" for s in states(url).values())
                assert dead < 1 + behind, "the kill landed after the drain; make it longer"
                tg.mode = "ok"
            else:
                eventually_blocking(
                    lambda: all(states(url)[m] == "dead" for m in accepted),
                    within=20,
                    what="the queue dead-lettered behind the open circuit",
                )
                assert circuit(url) is not None
                tg.release.set()  # let the hanging requests go
                tg.release = threading.Event()
                tg.arrived.clear()
                tg.mode = "gate" if case == "closing" else "hang"
                seen = len(tg.ids())
                send("p")  # waits for the probe, due 5 s after the circuit opened
                eventually_blocking(
                    lambda: "p" in tg.ids()[seen:], within=20, what="the probe p in flight"
                )
                if case == "closing":
                    eventually_blocking(tg.arrived.is_set, within=5, what="the probe held")
                owner.kill()  # (a) the probe is in flight; (d) it is being answered
                if case == "still_down":
                    # the other hub probes again at once (the stored probe time has
                    # passed): p is dead, its sender told, and the interval doubles
                    eventually_blocking(
                        lambda: states(url)["p"] == "dead", within=20, what="p dead-lettered"
                    )
                    stored = json.loads(circuit(url) or "{}")
                    assert (stored["probes"], stored["probe_interval"]) == (1, 10.0), stored
                tg.mode = "ok"
                tg.release.set()
            send("q0", "q1")

            # the other hub takes the member over and settles everything
            eventually_blocking(
                lambda: owner_pid(url) == other.proc.pid, within=20, what="the takeover"
            )
            eventually_blocking(
                lambda: (
                    set(states(url).values()) <= {"acked", "dead"}
                    and len(states(url)) == len(accepted)
                ),
                within=40,
                what="every copy acked or dead",
                show=lambda: states(url),
            )
            final = states(url)
            assert final["q0"] == final["q1"] == "acked"
            eventually_blocking(
                lambda: circuit(url) is None, within=10, what="the stored circuit closed"
            )
            notices = told(url)
            for mid, state in final.items():
                if state == "dead":
                    assert mid in notices, f"the sender of dead {mid} was not told"
            with tg.lock:
                got = list(tg.got)
            delivered = [m for m in accepted if final[m] == "acked"]
            first = [m for m in dict.fromkeys(mid for mid, _, _ in got) if final[m] == "acked"]
            assert first == delivered, "delivered in send order"
            for mid, key, _ in got:
                assert key == mid, "the Idempotency-Key is the message id on every try"
            counts: dict[str, int] = {}
            for mid, _, _ in got:
                if final[mid] == "acked":
                    counts[mid] = counts.get(mid, 0) + 1
            twice = sorted(m for m, n in counts.items() if n > 1)
            # only the copy the dead hub was pushing reaches the target again
            assert twice == {"push": ["m000"], "probe": ["p"], "closing": ["p"]}.get(case, []), (
                twice
            )
        finally:
            for h in hubs:
                h.kill()
