"""A real ``serve`` whose SQLite store (and its -wal and -shm) is on a disk that fills
while four senders send and four receivers receive and ack, maintenance runs and
another process tries a WAL checkpoint: every send is answered as stored (and then
received once) or refused naming the full disk and the way out, with Retry-After; once
space is freed the hub serves again without a restart and nothing is left leased; the
process lives, and its log says the outage once rather than once a request. The disk is
a small tmpfs of the test's own (:mod:`tests.full_disk`)."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backchannel import config
from backchannel.interfaces.http import FailureLog
from backchannel.testing import eventually_blocking
from tests.conftest import BIN, Server, start_server
from tests.full_disk import fill, small_disk

pytestmark = pytest.mark.timeout(180)

FULL = "the disk holding it is full: free space there (the hub goes on by itself"


@pytest.fixture
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    with small_disk(request, tmp_path, "16m") as mount:
        yield mount


class Traffic:
    """Four senders (``s<i>`` to ``r<i>``, ids of their own) and four receivers that ack
    what they receive, counting every answer."""

    def __init__(self, srv: Server, tokens: dict[str, str]) -> None:
        self.srv, self.tokens = srv, tokens
        self.answers: dict[str, int] = {}  # message id -> status of its send
        self.refusals: list[httpx.Response] = []
        self.received: collections.Counter[str] = collections.Counter()
        self.failures: list[str] = []  # anything that is not an answer, or not expected
        self.sending, self.receiving = threading.Event(), threading.Event()
        self.sending.set()
        self.receiving.set()
        self.lock = threading.Lock()
        self.threads = [
            *(threading.Thread(target=self._send, args=(i,)) for i in range(4)),
            *(threading.Thread(target=self._receive, args=(i,)) for i in range(4)),
        ]

    def sent(self) -> int:
        with self.lock:
            return len(self.answers)

    def _send(self, i: int) -> None:
        with self.srv.client(self.tokens[f"s{i}"]) as c:
            n = 0
            while self.sending.is_set():
                mid = f"m-{i}-{n}"
                n += 1
                try:
                    r = c.post("/v1/messages", json={"to": f"r{i}", "text": mid, "message_id": mid})
                except httpx.HTTPError as exc:
                    self.failures.append(f"send {mid}: {exc!r}")
                    continue
                with self.lock:
                    self.answers[mid] = r.status_code
                    if r.status_code not in (200, 201):
                        self.refusals.append(r)

    def _receive(self, i: int) -> None:
        with self.srv.client(self.tokens[f"r{i}"]) as c:
            while self.receiving.is_set():
                try:
                    r = c.get("/v1/inbox", params={"limit": 50, "wait": 0.2})
                    if r.status_code != 200:
                        self._expect_full(r)
                        continue
                    ids = [m["message_id"] for m in r.json()["messages"]]
                    if not ids:
                        continue
                    a = c.post("/v1/inbox/ack", json={"message_ids": ids})
                except httpx.HTTPError as exc:
                    self.failures.append(f"receive r{i}: {exc!r}")
                    continue
                if a.status_code == 200:
                    with self.lock:
                        self.received.update(ids)
                else:  # not acked: the copies come back when their lease ends
                    self._expect_full(a)

    def _expect_full(self, r: httpx.Response) -> None:
        if r.status_code != 503 or FULL not in r.text:
            self.failures.append(
                f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text}"
            )


def test_a_full_disk_under_a_serving_hub_loses_nothing_doubles_nothing_and_passes(
    disk: Path, tmp_path: Path
) -> None:
    db = disk / "hub.db"
    srv = start_server(tmp_path / "home", f"sqlite://{db}", "--lease", "3")
    try:
        tokens = srv.team("t", *(f"s{i}" for i in range(4)), *(f"r{i}" for i in range(4)))
        traffic = Traffic(srv, tokens)
        for t in traffic.threads:
            t.start()
        eventually_blocking(lambda: traffic.sent() >= 100 or None, what="sends before")
        filler = fill(disk)
        refused_before = len(traffic.refusals)
        eventually_blocking(
            lambda: len(traffic.refusals) >= refused_before + 200 or None,
            what="sends refused on the full disk",
            within=60,
        )
        with contextlib.suppress(sqlite3.Error):  # another process checkpoints the WAL
            conn = sqlite3.connect(db, timeout=10)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()
        filler.unlink()
        freed_at = traffic.sent()
        eventually_blocking(
            lambda: (
                sum(s in (200, 201) for s in list(traffic.answers.values())[freed_at:]) >= 100
                or None
            ),
            what="sends stored again once there is room",
            within=60,
        )
        traffic.sending.clear()
        for t in traffic.threads[:4]:
            t.join(30)
        stored = {m for m, s in traffic.answers.items() if s in (200, 201)}
        eventually_blocking(
            lambda: set(traffic.received) >= stored or None,
            what="every stored message received",
            within=60,
        )
        traffic.receiving.clear()
        for t in traffic.threads[4:]:
            t.join(30)

        assert traffic.failures == []
        assert traffic.refusals, "the disk never filled"
        for r in traffic.refusals:
            assert r.status_code == 503 and r.headers["Retry-After"]
            assert FULL in r.json()["error"]["message"]
            assert "nothing was stored" in r.json()["error"]["message"]
        assert set(traffic.received) == stored  # nothing refused was stored after all
        assert [m for m, n in traffic.received.items() if n > 1] == []
        assert srv.proc.poll() is None
        with srv.client(tokens["r0"]) as c:  # nothing left leased or queued
            assert c.get("/v1/inbox", params={"limit": 50}).json()["messages"] == []
    finally:
        srv.stop()
    log = (srv.home / "serve.log").read_text()
    said = [line for line in log.splitlines() if "backchannel.http" in line and "is full" in line]
    assert 1 <= len(said) <= 2, "\n".join(said[:5])
    assert "Traceback" not in log


def test_a_failure_said_again_after_a_while_counts_the_requests_it_failed_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = FailureLog(every=0.2)
    caplog.set_level(logging.DEBUG, "backchannel.http")
    for _ in range(5):
        failures.failed("POST /v1/messages", "the store is away")
    failures.failed("GET /v1/inbox", "something else")
    until = time.monotonic() + 0.2
    while time.monotonic() < until:
        time.sleep(0.05)
    failures.failed("GET /v1/inbox", "the store is away")
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 3
    assert said[0].startswith("POST /v1/messages failed: the store is away (other requests")
    assert said[1].startswith("GET /v1/inbox failed: something else")
    assert said[2].startswith("GET /v1/inbox failed: the store is away (and 4 other requests")


def test_a_hub_whose_log_is_on_a_full_disk_serves_and_stops_cleanly(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``serve``'s output (its banner, warnings, log records, the line it stops with)
    goes to a file on a disk that is full: none of it is written, and the hub serves all
    the same and stops with status 0."""
    with small_disk(request, tmp_path, "1m") as log_disk:
        fill(log_disk)
        home = tmp_path / "home"
        home.mkdir()
        with open(log_disk / "serve.log", "ab") as log:
            proc = subprocess.Popen(
                [str(BIN), "serve", "--port", "0", "--store", f"sqlite://{home / 'hub.db'}"],
                env={**os.environ, "BACKCHANNEL_HOME": str(home)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:

            def up() -> str | None:
                assert proc.poll() is None, f"serve exited with {proc.returncode}"
                info = config.read_server_info(home)
                return str(info["url"]) if info else None

            url = eventually_blocking(up, what="serve to come up", within=30)
            admin = {"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"}
            r = httpx.post(f"{url}/v1/teams", json={"name": "t"}, headers=admin, timeout=10)
            assert r.status_code == 201
            user = {"Authorization": f"Bearer {r.json()['user_token']}"}
            httpx.post(f"{url}/v1/teams/t/members", json={"name": "a"}, headers=admin, timeout=10)
            r = httpx.post(f"{url}/v1/messages", json={"to": "a", "text": "hi"}, headers=user)
            assert r.status_code == 201
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.mark.parametrize("token_there", [False, True])
def test_serve_on_a_full_data_directory_says_so_in_one_line(
    request: pytest.FixtureRequest, tmp_path: Path, token_there: bool
) -> None:
    """Its admin token (or, the token there, its server.json) cannot be written: the
    error names the disk and the way out, without a traceback, and leaves no file cut
    short."""
    with small_disk(request, tmp_path, "1m") as disk:
        home = disk / "home"
        home.mkdir(mode=0o700)
        token = "bca_" + "x" * 43
        if token_there:
            (home / "admin.token").write_text(token + "\n")
        fill(disk)
        run = subprocess.run(
            [str(BIN), "serve", "--port", "0", "--store", f"sqlite://{tmp_path / 'hub.db'}"],
            env={**os.environ, "BACKCHANNEL_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 1
        assert f"no space left on the disk holding {home}" in run.stderr, run.stderr
        assert "free space there" in run.stderr
        assert "Traceback" not in run.stderr
        left = sorted(p.name for p in home.iterdir())
        assert left == (["admin.token"] if token_there else [])
        if token_there:
            assert (home / "admin.token").read_text() == token + "\n"


def test_a_small_disk_its_log_filled_serves_again_once_space_is_freed_and_goes_on(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The store fills a 4 MB disk (a filler leaves it 1 MB), its write-ahead log with
    it; a log on a full disk cannot be checkpointed (that moves its pages into the
    database file, which grows). Once the filler is deleted the hub checkpoints and
    truncates its log by itself, and goes on storing far more than the disk holds: its
    log, left to SQLite's automatic checkpoint at 1000 pages (4 MB), would fill the
    disk by itself again and stay so. No restart, nothing lost or doubled."""
    with small_disk(request, tmp_path, "4m") as disk:
        filler = fill(disk)
        os.truncate(filler, filler.stat().st_size - (1 << 20))
        db = disk / "hub.db"
        srv = start_server(tmp_path / "home", f"sqlite://{db}", "--lease", "3")
        traffic: Traffic | None = None
        try:
            tokens = srv.team("t", *(f"s{i}" for i in range(4)), *(f"r{i}" for i in range(4)))
            traffic = Traffic(srv, tokens)
            for t in traffic.threads:
                t.start()
            eventually_blocking(
                lambda: len(traffic.refusals) >= 50 or None,
                what="sends refused once the log filled the disk",
                within=60,
            )
            filler.unlink()
            freed_at = traffic.sent()
            eventually_blocking(
                lambda: (
                    sum(s in (200, 201) for s in list(traffic.answers.values())[freed_at:]) >= 1500
                    or None
                ),
                what="sends stored again, more than the disk holds",
                within=90,
                show=lambda: (
                    list(traffic.answers.values())[-1:],
                    traffic.refusals[-1:] and traffic.refusals[-1].text,
                ),
            )
            traffic.sending.clear()
            for t in traffic.threads[:4]:
                t.join(30)
            stored = {m for m, s in traffic.answers.items() if s in (200, 201)}
            eventually_blocking(
                lambda: set(traffic.received) >= stored or None,
                what="every stored message received",
                within=60,
            )
            traffic.receiving.clear()
            for t in traffic.threads[4:]:
                t.join(30)

            assert traffic.failures == []
            for r in traffic.refusals:
                assert r.status_code == 503 and r.headers["Retry-After"]
                assert FULL in r.json()["error"]["message"]
            assert set(traffic.received) == stored
            assert [m for m, n in traffic.received.items() if n > 1] == []
            assert srv.proc.poll() is None
        finally:
            if traffic is not None:  # its threads end, whatever failed
                traffic.sending.clear()
                traffic.receiving.clear()
            srv.stop()
