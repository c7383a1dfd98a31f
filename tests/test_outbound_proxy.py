"""The hub's requests to the outside (the outbox's POSTs to other hubs, webhooks, A2A
agents) on a machine set up for an HTTP proxy: a service elsewhere is reached through
the proxy the environment names, as the CLI's client reaches a hub elsewhere, unless
``NO_PROXY`` names it; a service on this machine (``127.0.0.1``, ``localhost``) is
reached straight, whatever the environment says. The proxy here is a real one on
loopback that writes down the request lines it is sent and answers each itself."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from backchannel import outbound
from backchannel.callbacks import Service
from backchannel.testing import eventually
from tests.test_outbound import _caller, _delegate, _failed
from tests.test_proxy_env import RecordingProxy

#: A host no resolver knows (RFC 2606): reached straight, the request fails at once.
ELSEWHERE = "hub-b.invalid"


#: A service's (or a proxy's) answer taking the request.
ACCEPTED = (
    b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
)


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingProxy]:
    """A proxy the environment names for every scheme, with no ``NO_PROXY``."""
    p = RecordingProxy(ACCEPTED)
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", p.url)
    monkeypatch.setenv("http_proxy", p.url)
    try:
        yield p
    finally:
        p.close()


async def test_the_outbox_posts_to_a_hub_elsewhere_through_the_environments_proxy(
    proxy: RecordingProxy,
) -> None:
    """A hub behind a corporate proxy delegates to a hub elsewhere: the POST to
    ``/api/chat`` goes through the proxy (which is the only way out of such a network)."""
    hub = await _caller(Service("hub-b", f"http://{ELSEWHERE}:8080", "tok-b"))
    try:
        await _delegate(hub, "worker@hub-b")
        await eventually(
            lambda: any(
                line.startswith(f"POST http://{ELSEWHERE}:8080/api/chat ") for line in proxy.lines
            ),
            what="the outbox's POST at the proxy",
            show=lambda: proxy.lines,
        )
    finally:
        await hub.close()


async def test_no_proxy_naming_the_hub_elsewhere_sends_the_outbox_straight(
    proxy: RecordingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_PROXY", ".invalid")
    monkeypatch.setenv("no_proxy", ".invalid")
    hub = await _caller(Service("hub-b", f"http://{ELSEWHERE}:8080", "tok-b"))
    try:
        reason = await _failed(hub, await _delegate(hub, "worker@hub-b"))
    finally:
        await hub.close()
    assert proxy.lines == [], "NO_PROXY names the host: the proxy is left out"
    assert ELSEWHERE in reason or "connect" in reason.lower(), reason


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_service_on_this_machine_is_reached_straight(
    proxy: RecordingProxy, host: str
) -> None:
    """No ``NO_PROXY`` for loopback: a service here is reached straight all the same, as
    the CLI reaches a hub here (a proxy cannot reach this machine's loopback)."""
    service = RecordingProxy(ACCEPTED)
    try:
        async with outbound.client(deadline=5) as http:
            resp = await http.post(f"http://{host}:{service.port}/api/chat", json={})
        assert resp.status_code == 202
        assert service.lines == ["POST /api/chat HTTP/1.1"]
        assert proxy.lines == []
    finally:
        service.close()


async def test_a_proxy_that_cannot_be_used_is_named_in_the_failure(
    proxy: RecordingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy of a scheme the hub cannot speak fails the request, naming the proxy
    (without its password) and the way out."""
    monkeypatch.setenv("HTTP_PROXY", "ftp://user:hunter2@proxy.invalid:21")
    monkeypatch.setenv("http_proxy", "ftp://user:hunter2@proxy.invalid:21")
    async with outbound.client(deadline=5) as http:
        with pytest.raises(httpx.ProxyError) as caught:
            await http.post(f"http://{ELSEWHERE}/api/chat", json={})
    said = str(caught.value)
    assert "proxy.invalid" in said and "hunter2" not in said, said
    assert "NO_PROXY" in said, said
