"""``backchannel serve`` survives clients that misbehave at the socket level, and says
why it stops when it does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import BIN, Server, start_server


def _host_port(srv: Server) -> tuple[str, int]:
    host, _, port = srv.url.removeprefix("http://").rpartition(":")
    return host, int(port)


def _send_and_close(address: tuple[str, int], path: str, *, reset: bool = False) -> None:
    """Send a whole request, then close at once (with a reset: SO_LINGER 0), so the
    server's answer is written to a socket the peer has already torn down."""
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _ignored_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn line")


@pytest.mark.slow
def test_clients_that_close_early_do_not_kill_the_server(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home")
    try:
        address = _host_port(srv)
        for i in range(100):
            for path in ("/healthz", "/openapi.json", "/docs"):
                _send_and_close(address, path, reset=i % 2 == 1)
        # and the same with a read of half the answer before hanging up
        for _ in range(20):
            with socket.create_connection(address, timeout=5) as s:
                s.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
                s.recv(100)
        assert srv.proc.poll() is None, (srv.home / "serve.log").read_text()
        assert httpx.get(f"{srv.url}/healthz", timeout=10).json() == {"status": "ok"}
        assert httpx.get(f"{srv.url}/openapi.json", timeout=10).status_code == 200
        # a broken pipe is an error on that one socket, never a signal that ends the hub
        assert _ignored_signals(srv.proc.pid) & (1 << (signal.SIGPIPE - 1))
    finally:
        srv.stop()


def test_sighup_stops_the_server_cleanly_and_says_why(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home")
    srv.proc.send_signal(signal.SIGHUP)
    assert srv.proc.wait(20) == 0
    log = (srv.home / "serve.log").read_text()
    assert "stopped on SIGHUP" in log
    assert not (srv.home / "server.json").exists()


def test_sigterm_stops_the_server_cleanly_and_says_why(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home")
    srv.proc.terminate()
    assert srv.proc.wait(20) == 0
    assert "stopped on SIGTERM" in (srv.home / "serve.log").read_text()
    assert not (srv.home / "server.json").exists()


def test_a_crash_is_logged_with_its_cause(tmp_path: Path) -> None:
    """A fatal signal the process cannot survive still leaves its cause in the log."""
    srv = start_server(tmp_path / "home")
    os.kill(srv.proc.pid, signal.SIGABRT)
    assert srv.proc.wait(20) != 0
    log = (srv.home / "serve.log").read_text()
    assert "Fatal Python error: Aborted" in log
    # the stale server.json names a dead process, so no command trusts it
    info = json.loads((srv.home / "server.json").read_text())
    from backchannel import config

    assert info["pid"] == srv.proc.pid
    assert config.read_server_info(srv.home) is None


def test_an_exception_that_ends_the_server_is_logged_with_its_traceback(tmp_path: Path) -> None:
    """A data directory the hub cannot write its server.json into (a directory sits
    there) fails the hub after it opened the store: the log says what and where."""
    home = tmp_path / "home"
    (home / "server.json").mkdir(parents=True)
    run = subprocess.run(
        [str(BIN), "serve", "--port", "0", "--store", f"sqlite://{home / 'bc.db'}"],
        env={**os.environ, "BACKCHANNEL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1
    assert "backchannel serve crashed: IsADirectoryError" in run.stderr
    assert "Traceback" in run.stderr
    assert "write_server_info" in run.stderr


def test_stopping_with_receivers_waiting_answers_them_and_logs_no_traceback(
    tmp_path: Path,
) -> None:
    srv = start_server(tmp_path / "home")
    tokens = srv.team("crew", "worker")
    auth = {"Authorization": f"Bearer {tokens['worker']}"}
    answers: dict[str, object] = {}
    # a long-poll and the streams: the inbox's, and the team's that `tail` reads
    poll = httpx.Client(base_url=srv.url, headers=auth, timeout=60)
    stream = httpx.Client(base_url=srv.url, headers=auth, timeout=60)
    env = {**os.environ, "BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["user"]}
    tail = subprocess.Popen(
        [str(BIN), "tail"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:

        def long_poll() -> None:
            try:
                answers["poll"] = poll.get("/v1/inbox", params={"wait": 60}).status_code
            except httpx.HTTPError as exc:  # the connection closed: also an answer
                answers["poll"] = type(exc).__name__

        waiter = threading.Thread(target=long_poll)
        waiter.start()
        with srv.client(tokens["user"]) as c:
            c.post("/v1/messages", json={"to": "user", "text": "for tail to show"})
        assert tail.stdout is not None and tail.stderr is not None
        assert "for tail to show" in tail.stdout.readline().decode()
        with (
            stream.stream("GET", "/v1/inbox/stream") as inbox,
            stream.stream("GET", "/v1/teams/crew/events") as events,
        ):
            readers = [inbox.iter_lines(), events.iter_lines()]
            assert [next(r) for r in readers] == [": connected", ": connected"]
            srv.proc.terminate()
            assert srv.proc.wait(20) == 0
            for r in readers:  # what is left, to the stream's end
                with contextlib.suppress(httpx.HTTPError):
                    for _ in r:
                        pass
        waiter.join(20)
        assert answers["poll"] != 500
        assert tail.wait(20) == 1
        assert "the hub ended the stream" in tail.stderr.read().decode()
        log = (srv.home / "serve.log").read_text()
        assert "Traceback" not in log
        assert "stopped on SIGTERM" in log
    finally:
        srv.stop()
        tail.kill()
        tail.communicate()
        poll.close()
        stream.close()
