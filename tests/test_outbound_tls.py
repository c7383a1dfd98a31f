"""The hub's own HTTPS requests (a webhook, the outbox's POST to another hub) trust the
certificates the environment names, as the CLI's client does: ``SSL_CERT_FILE`` (a PEM
bundle), else ``SSL_CERT_DIR``. A service with a certificate signed by a CA of one's own
(a hub elsewhere on a private CA, or anything seen through a TLS-inspecting proxy) is
refused without them, by a failure that names the host, the certificate problem and the
way out, and retried or dead-lettered as any connection failure (never dropped); with
them it gets each message once. Verification is never turned off.

The service is a real HTTPS server on 127.0.0.1 whose certificate is signed by a test
CA made here."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel import outbound
from backchannel.callbacks import Service
from backchannel.testing import eventually
from tests.delivery.conftest_adapters import dispatching, running_hub, wait_state
from tests.peers import QuietHandler
from tests.test_outbound import _caller, _delegate, _failed, _outbox_idle

CERT_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")


@dataclass
class PrivateCA:
    """A CA of one's own (``ca``, a PEM file) and a certificate for 127.0.0.1 it signed
    (``cert`` and ``key``)."""

    ca: Path
    cert: Path
    key: Path


def _private_ca(tmp: Path) -> PrivateCA:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "backchannel test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.OID_SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    made = PrivateCA(tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem")
    made.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    made.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    made.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return made


@dataclass
class TLSService:
    """An HTTPS server on 127.0.0.1 answering every POST ``status``: :attr:`paths` holds
    the path of each request that got through, :attr:`refused` counts the handshakes
    that did not (the client did not trust the certificate)."""

    url: str = ""
    paths: list[str] = field(default_factory=list)
    refused: int = 0


@contextmanager
def tls_service(ca: PrivateCA, status: int = 202) -> Iterator[TLSService]:
    svc = TLSService()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.cert, ca.key)
    lock = threading.Lock()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                svc.paths.append(self.path)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def finish_request(self, request: Any, client_address: Any) -> None:
            request.settimeout(5)
            try:
                tls = context.wrap_socket(request, server_side=True)
            except OSError:
                with lock:
                    svc.refused += 1
                return
            with tls:
                self.RequestHandlerClass(tls, client_address, self)

    server = Server(("127.0.0.1", 0), Handler)
    svc.url = f"https://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield svc
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PrivateCA:
    """A private CA, with neither certificate variable set."""
    for name in CERT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return _private_ca(tmp_path)


def _names_the_way_out(reason: str, svc: TLSService) -> None:
    host = svc.url.removeprefix("https://")
    assert host in reason, reason
    assert "certificate" in reason and "SSL_CERT_FILE" in reason, reason


async def test_a_webhook_on_a_private_ca_is_dead_lettered_named_without_ssl_cert_file(
    ca: PrivateCA,
) -> None:
    """Not trusted: every attempt fails at the handshake (nothing reaches the service),
    and the dead letter names the service's address, the certificate and the way out."""
    with tls_service(ca, 200) as svc:
        async with running_hub({"bot": svc.url}, max_attempts=3) as hub:
            await hub.add_member("t", "a", delivery={"type": "webhook", "service": "bot"})
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                st = await wait_state(hub, "t", sent.message_id, "dead", within=20)
    assert svc.paths == [] and svc.refused >= 1
    _names_the_way_out(st.deliveries[0].dead_reason or "", svc)


async def test_a_webhook_on_a_private_ca_named_in_ssl_cert_file_gets_the_message_once(
    ca: PrivateCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca))
    with tls_service(ca, 200) as svc:
        async with running_hub({"bot": svc.url}) as hub:
            await hub.add_member("t", "a", delivery={"type": "webhook", "service": "bot"})
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                await wait_state(hub, "t", sent.message_id, "acked")
    assert svc.paths == ["/backchannel/deliver"] and svc.refused == 0


async def test_a_hub_elsewhere_on_a_private_ca_fails_the_delegation_named(
    ca: PrivateCA,
) -> None:
    """The outbox's POST to another hub: retried within the budget, then the delegation
    fails with the reason, which the delegating agent hears."""
    with tls_service(ca) as svc:
        hub = await _caller(Service("hub-b", svc.url, "tok-b"))
        try:
            reason = await _failed(hub, await _delegate(hub, "worker@hub-b"))
        finally:
            await hub.close()
    assert svc.paths == [] and svc.refused >= 1
    _names_the_way_out(reason, svc)


async def test_a_hub_elsewhere_on_a_private_ca_named_in_ssl_cert_file_gets_the_post_once(
    ca: PrivateCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca))
    with tls_service(ca) as svc:
        hub = await _caller(Service("hub-b", svc.url, "tok-b"))
        try:
            await _delegate(hub, "worker@hub-b")
            await eventually(lambda: _outbox_idle(hub), what="the POST to end", within=15)
        finally:
            await hub.close()
    assert svc.paths == ["/api/chat"] and svc.refused == 0


@pytest.fixture
def cert_dir(ca: PrivateCA, tmp_path: Path) -> Path:
    """A directory holding the private CA under its hashed name, as ``SSL_CERT_DIR``
    wants it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to name the CA's file by its hash")
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(ca.ca, certs / "ca.pem")
    subprocess.run(["openssl", "rehash", str(certs)], check=True, capture_output=True, timeout=60)
    return certs


async def test_a_directory_named_in_ssl_cert_dir_is_trusted(
    ca: PrivateCA, cert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SSL_CERT_DIR``: a directory of CA certificates under their hashed names."""
    monkeypatch.setenv("SSL_CERT_DIR", str(cert_dir))
    with tls_service(ca) as svc:
        async with outbound.client(deadline=5) as http:
            resp = await http.post(f"{svc.url}/api/chat", json={})
    assert resp.status_code == 202 and svc.paths == ["/api/chat"]


async def test_a_certificate_file_that_cannot_be_read_is_named(
    ca: PrivateCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``SSL_CERT_FILE`` that names no file fails the request by the variable's name,
    never by falling back to other certificates or to no verification."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    with tls_service(ca) as svc:
        async with outbound.client(deadline=5) as http:
            with pytest.raises(httpx.ConnectError) as caught:
                await http.post(f"{svc.url}/api/chat", json={})
    said = str(caught.value)
    assert "SSL_CERT_FILE" in said and "missing.pem" in said, said
    assert svc.paths == []


async def test_an_a2a_agent_on_a_private_ca_fails_the_delegation_named(ca: PrivateCA) -> None:
    """A call to an A2A agent goes through the same client: its agent card is not
    fetched from a host not trusted, and the delegation's failure says why."""
    pytest.importorskip("a2a.client")
    with tls_service(ca, 200) as svc:
        hub = await _caller(Service("weather", svc.url, "tok-weather", "a2a"))
        try:
            reason = await _failed(hub, await _delegate(hub, "forecaster@weather"))
        finally:
            await hub.close()
    assert svc.paths == [] and svc.refused >= 1
    _names_the_way_out(reason, svc)


async def test_an_https_proxy_on_a_private_ca_named_in_ssl_cert_file_is_used(
    ca: PrivateCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy the environment names by an ``https://`` address (a corporate proxy on the
    company's CA) is trusted by the same certificates as the services behind it."""
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca))
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    with tls_service(ca) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("http_proxy", proxy.url)
        async with outbound.client(deadline=5) as http:
            resp = await http.post("http://hub-b.invalid:8080/api/chat", json={})
    assert resp.status_code == 202
    assert proxy.paths == ["http://hub-b.invalid:8080/api/chat"]


async def test_an_https_proxy_not_trusted_is_named_in_the_failure(
    ca: PrivateCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    with tls_service(ca) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("http_proxy", proxy.url)
        async with outbound.client(deadline=5) as http:
            with pytest.raises(httpx.ConnectError) as caught:
                await http.post("http://hub-b.invalid:8080/api/chat", json={})
    said = str(caught.value)
    assert proxy.url in said and "certificate" in said and "SSL_CERT_FILE" in said, said
    assert proxy.paths == []
