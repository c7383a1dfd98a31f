"""A machine set up for an HTTP proxy (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``, no
``NO_PROXY`` for loopback): a hub on this machine is reached straight, never through the
proxy (which would hold every call or see the bearer token); a hub elsewhere is reached
through it, as the environment says. The proxy here is a real one on loopback that
records the request lines it is sent and answers each with a 502 page."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from backchannel.client import SyncClient
from backchannel.errors import PeerError
from backchannel.runtimes import keeper
from backchannel.testing import eventually_blocking
from tests.conftest import BIN, Server

PAGE = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


#: A corporate proxy's answer when it cannot reach the host asked for.
BAD_GATEWAY = (
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(PAGE), PAGE)
)


class RecordingProxy:
    """A listener on loopback that writes down the first line and the headers of each
    request and gives each the same ``answer``: by default a 502 with an HTML page, as a
    corporate proxy that cannot reach does. A proxy (a request through it names the
    whole URL) or a service (a request to it names only the path)."""

    def __init__(self, answer: bytes = BAD_GATEWAY) -> None:
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                head = b""
                try:
                    while b"\r\n\r\n" not in head and (data := conn.recv(65536)):
                        head += data
                    self.requests.append(head.partition(b"\r\n\r\n")[0].decode("latin-1"))
                    conn.sendall(self.answer)
                except OSError:
                    pass

    @property
    def lines(self) -> list[str]:
        """The first line of each request."""
        return [r.partition("\r\n")[0] for r in self.requests]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def proxy() -> Iterator[RecordingProxy]:
    p = RecordingProxy()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def token(server: Server) -> str:
    """A member's token, made before the proxy is in the environment."""
    return server.team("t", "a", "b")["a"]


@pytest.fixture
def proxied(proxy: RecordingProxy, monkeypatch: pytest.MonkeyPatch) -> RecordingProxy:
    """The proxy named in this process's environment, with no ``NO_PROXY``."""
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, proxy.url)
    return proxy


def test_the_sdk_reaches_a_hub_on_this_machine_past_the_proxy(
    server: Server, token: str, proxied: RecordingProxy
) -> None:
    proxy = proxied
    for url in (server.url, server.url.replace("127.0.0.1", "localhost")):
        with SyncClient(url, token) as hub:
            assert hub.me().name == "a"
    assert proxy.requests == []


def test_the_sdk_reaches_a_hub_elsewhere_through_the_proxy(proxied: RecordingProxy) -> None:
    proxy = proxied
    hub = SyncClient("http://hub.example.invalid:8765", "tok", retry_within=0)
    with hub, pytest.raises(PeerError, match="502"):
        hub.me()
    assert proxy.requests and proxy.requests[0].startswith(
        "GET http://hub.example.invalid:8765/v1/me "
    )


def test_the_cli_reaches_a_hub_on_this_machine_past_the_proxy(
    server: Server, token: str, proxied: RecordingProxy, tmp_path: Path
) -> None:
    """``send``, ``status`` (its /healthz) and the full hook path, each in a process of
    its own with the proxy in its environment."""
    proxy = proxied
    env = {**os.environ, "BACKCHANNEL_URL": server.url, "BACKCHANNEL_TOKEN": token}
    env.pop("BACKCHANNEL_HOME", None)
    for args in (["send", "b", "hello"], ["status", "--json"]):
        done = subprocess.run(
            [str(BIN), *args], env=env, cwd=tmp_path, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr.decode()
    assert proxy.requests == []


def test_the_keeper_beats_to_a_hub_on_this_machine_past_the_proxy(
    server: Server, token: str, proxied: RecordingProxy
) -> None:
    proxy = proxied
    assert keeper.beat(server.url, token, "4242:1") is not None
    assert proxy.requests == []


def test_the_command_hook_reaches_a_hub_elsewhere_through_the_proxy(
    proxied: RecordingProxy, tmp_path: Path
) -> None:
    """The lean hook speaks straight to the hub; for a hub past a proxy the full CLI
    takes the call, through the proxy, and the runtime still gets its JSON at once."""
    proxy = proxied
    env = {**os.environ, "BACKCHANNEL_TOKEN": "tok"}
    done = subprocess.run(
        [str(BIN), "hook", "claude-code", "--url", "http://hub.example.invalid:8765"],
        input=b'{"hook_event_name": "UserPromptSubmit", "session_id": "s1", "prompt": "hi"}',
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert done.stdout.strip() == b"{}"
    eventually_blocking(lambda: bool(proxy.requests), what="the hook's call at the proxy")
    assert proxy.requests[0].startswith("POST http://hub.example.invalid:8765/v1/hooks/claude-code")
