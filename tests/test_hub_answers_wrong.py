"""What the CLI, the command hook and the SDK say when what answers at the hub's URL is
not a hub they can use: a TLS server whose certificate this machine does not trust (a
hub's self-signed one), and a reverse proxy that answers 502 with an HTML page while
the hub behind it is down. Each names the cause and the way out, the CLI exits 1, the
hook answers ``{}`` at once, and no traceback is shown."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backchannel.client import SyncClient
from backchannel.errors import PeerError
from tests.conftest import BIN
from tests.test_proxy_env import RecordingProxy


class SelfSignedServer:
    """A TLS server on loopback with a certificate of its own, signed by nobody."""

    def __init__(self, tmp: Path) -> None:
        self.cert, key = tmp / "cert.pem", tmp / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(key), "-out", str(self.cert)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(self.cert, key)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                conn.settimeout(5)
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(65536)
            except OSError:
                conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[SelfSignedServer]:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    srv = SelfSignedServer(tmp_path)
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def bad_gateway() -> Iterator[RecordingProxy]:
    p = RecordingProxy()  # answers every request 502 with an HTML page
    try:
        yield p
    finally:
        p.close()


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        env.pop(name, None)
    return {**env, "BACKCHANNEL_URL": url, "BACKCHANNEL_TOKEN": "tok"}


def _cli(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args], input=stdin, capture_output=True, text=True, env=_env(url), timeout=60
    )


STOP = json.dumps({"hook_event_name": "Stop", "session_id": "s1", "stop_hook_active": False})


def test_a_self_signed_certificate_is_named_with_the_way_out(tls: SelfSignedServer) -> None:
    started = time.monotonic()
    send = _cli(tls.url, "send", "b", "hi")
    assert send.returncode == 1, send.stderr
    assert "Traceback" not in send.stderr
    assert "certificate" in send.stderr and "SSL_CERT_FILE" in send.stderr, send.stderr
    assert "backchannel serve` running" not in send.stderr
    for args in (["hook", "claude-code"], ["-v", "hook", "claude-code"]):  # lean, full
        hook = _cli(tls.url, *args, stdin=STOP)
        assert (hook.returncode, hook.stdout.strip()) == (0, "{}"), hook.stderr
        assert "SSL_CERT_FILE" in hook.stderr, (args, hook.stderr)
    with SyncClient(tls.url, "tok") as hub, pytest.raises(PeerError, match="SSL_CERT_FILE"):
        hub.me()
    # a certificate is not retried for the SDK's 10 s: nothing changes by trying again
    assert time.monotonic() - started < 30


def test_a_self_signed_certificate_named_in_ssl_cert_file_is_trusted(
    tls: SelfSignedServer,
) -> None:
    """The way out works: with SSL_CERT_FILE the TLS handshake succeeds (this server
    then hangs up, which is another failure than the certificate)."""
    env = {**_env(tls.url), "SSL_CERT_FILE": str(tls.cert)}
    hook = subprocess.run(
        [str(BIN), "hook", "claude-code"],
        input=STOP, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert hook.stdout.strip() == "{}"
    assert "certificate" not in hook.stderr, hook.stderr


def test_a_reverse_proxys_502_page_is_named_with_the_way_out(
    bad_gateway: RecordingProxy,
) -> None:
    send = _cli(bad_gateway.url, "send", "b", "hi")
    assert send.returncode == 1, send.stderr
    assert "Traceback" not in send.stderr and "<html>" not in send.stderr, send.stderr
    assert "502 Bad Gateway" in send.stderr and "proxy" in send.stderr, send.stderr
    assert "backchannel serve` running behind it" in send.stderr
    for args in (["hook", "claude-code"], ["-v", "hook", "claude-code"]):
        hook = _cli(bad_gateway.url, *args, stdin=STOP)
        assert (hook.returncode, hook.stdout.strip()) == (0, "{}"), hook.stderr
        assert "backchannel serve` running behind it" in hook.stderr, (args, hook.stderr)
        assert "<html>" not in hook.stderr


def test_status_names_a_certificate_and_a_proxys_page_and_fails(
    tls: SelfSignedServer, bad_gateway: RecordingProxy
) -> None:
    """``backchannel status`` checks the hub first: a certificate it cannot trust is
    named with the way out (not "is it running?"), and a proxy's 502 page is not a hub
    that answers "no" with exit 0 and nothing said."""
    cert = _cli(tls.url, "status")
    assert cert.returncode == 1, cert
    assert "SSL_CERT_FILE" in cert.stderr and "still running" not in cert.stderr, cert.stderr
    proxy = _cli(bad_gateway.url, "status")
    assert proxy.returncode == 1, proxy
    assert "answers: no" in proxy.stdout
    assert "502" in proxy.stderr and "running behind it" in proxy.stderr, proxy.stderr
    assert "<html>" not in proxy.stderr


def test_doctor_names_a_certificate_and_a_proxys_page(
    tls: SelfSignedServer, bad_gateway: RecordingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backchannel.interfaces.cli_doctor import Attachment, check_hub

    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    [cert] = check_hub(Attachment("codex", "t/a", tls.url, {}, None), "tok")
    assert not cert.ok and "SSL_CERT_FILE" in cert.detail + cert.fix, cert
    assert "backchannel serve" not in cert.fix, cert
    [proxy] = check_hub(Attachment("codex", "t/a", bad_gateway.url, {}, None), "tok")
    assert not proxy.ok and "running behind it" in proxy.detail + proxy.fix, proxy
    assert "<html>" not in proxy.detail
