"""What a registered service answers is the service's to choose: an answer of a gigabyte,
one that never ends, a gzip bomb, an address with a password in it. The hub reads no more
than it needs, ends each request, names the failure, and never repeats a secret."""

from __future__ import annotations

import gzip
import threading
import time
import tracemalloc
from collections.abc import Iterator

import pytest

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core import delegation as rules
from backchannel.hub import Hub
from backchannel.testing import MemoryStore, eventually
from backchannel.types import DelegationState
from tests.peers import Flood, Peer, QuietHandler

SECRET = "test-secret-0123456789"
FAST = rules.RetryPolicy(start=0.05, factor=2, cap=0.2, budget=3, timeout=2)


@pytest.fixture
def floods() -> Iterator[list[Flood]]:
    made: list[Flood] = []
    yield made
    for f in made:
        f.close()


async def _caller(service: Service) -> Hub:
    hub = Hub(
        MemoryStore(),
        callbacks=CallbackConfig(secret=SECRET, services={service.name: service}, retry=FAST),
    )
    await hub.start()
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "lead")
    await hub.open_session("t", "lead", "lead-s")
    return hub


async def _delegate(hub: Hub, to: str) -> str:
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    d = await hub.delegate("t", "lead", "lead-s", to, "a task", tool_use_id="tu_1")
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
    return d.delegation_id


async def _outbox_idle(hub: Hub) -> bool:
    return await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox")) == []


async def _failed(hub: Hub, delegation_id: str) -> str:
    async def failed() -> bool:
        got = await hub.get_delegation("t", delegation_id)
        return got.state is DelegationState.FAILED

    await eventually(failed, what="the delegation to fail", within=15)
    return (await hub.get_delegation("t", delegation_id)).error or ""


async def test_a_task_taken_with_an_endless_answer_is_sent_once(floods: list[Flood]) -> None:
    """The other hub took the task (202) and then never ends its answer: the status is
    the outcome, the rest is not read, and the POST is not made again when its lease
    runs out (reading the answer forever kept the job leased, then fired it again)."""
    srv = Flood(202, endless=True)
    floods.append(srv)
    hub = await _caller(Service("hub-b", srv.url, "tok-b"))
    try:
        await _delegate(hub, "worker@hub-b")
        await eventually(lambda: _outbox_idle(hub), what="the POST to end", within=12)
        assert len(srv.requests) == 1
        [d] = await hub.list_delegations("t")
        assert d.state is DelegationState.PENDING  # the answer comes by its own POST
    finally:
        await hub.close()


async def test_a_refusal_with_an_endless_answer_fails_the_delegation_at_once(
    floods: list[Flood],
) -> None:
    srv = Flood(404, endless=True)
    floods.append(srv)
    hub = await _caller(Service("hub-b", srv.url, "tok-b"))
    try:
        error = await _failed(hub, await _delegate(hub, "worker@hub-b"))
        assert "HTTP 404" in error and "xxxx" in error
        assert len(error) < 1000
        assert len(srv.requests) == 1
    finally:
        await hub.close()


async def test_a_gzip_bomb_is_not_unpacked(floods: list[Flood]) -> None:
    """200 MB of zeros, 200 KB gzipped, sent though the hub asked for no compression."""
    bomb = gzip.compress(b"\0" * (200 * 1024 * 1024), compresslevel=9)
    srv = Flood(404, body=bomb, headers={"Content-Encoding": "gzip"})
    floods.append(srv)
    hub = await _caller(Service("hub-b", srv.url, "tok-b"))
    tracemalloc.start()
    try:
        error = await _failed(hub, await _delegate(hub, "worker@hub-b"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await hub.close()
    assert "HTTP 404" in error and "gzip-encoded" in error
    assert peak < 50 * 1024 * 1024
    assert srv.requests[0][1].get("Accept-Encoding") == "identity"


async def test_an_a2a_agent_card_that_never_ends_fails_the_delegation_named(
    floods: list[Flood],
) -> None:
    pytest.importorskip("a2a.client")
    srv = Flood(200, endless=True, headers={"Content-Type": "application/json"})
    floods.append(srv)
    hub = await _caller(Service("weather", srv.url, "tok-weather", "a2a"))
    try:
        error = await _failed(hub, await _delegate(hub, "forecaster@weather"))
        assert "larger than" in error
        assert len(srv.requests) == 1  # a refusal of the same answer again is not retried
    finally:
        await hub.close()


async def test_the_password_of_an_a2a_agents_address_is_not_in_the_failure(
    floods: list[Flood],
) -> None:
    pytest.importorskip("a2a.client")
    srv = Flood(404, body=b"no card here")
    floods.append(srv)
    url = srv.url.replace("http://", "http://agent:pw-s3cret@")
    hub = await _caller(Service("weather", url, "tok-weather", "a2a"))
    try:
        error = await _failed(hub, await _delegate(hub, "forecaster@weather"))
        assert "404" in error
        assert "pw-s3cret" not in error
        notes = await hub.receive("t", "lead", limit=20)
        assert all("pw-s3cret" not in g.message.text for g in notes)
    finally:
        await hub.close()


@pytest.mark.parametrize("kind", ["backchannel", "a2a"])
async def test_a_redirect_to_another_address_is_not_followed(
    floods: list[Flood], kind: str
) -> None:
    """A registered service that answers 307 to an address of its choosing (another port
    of this host here; the metadata service or an unregistered host alike) gets no
    request, token or task sent there: the delegation fails naming the status."""
    if kind == "a2a":
        pytest.importorskip("a2a.client")
    elsewhere = Flood(200, body=b"{}")
    floods.append(elsewhere)
    srv = Flood(307, headers={"Location": elsewhere.url + "/api/chat"})
    floods.append(srv)
    hub = await _caller(Service("svc", srv.url, "tok-svc", kind))
    try:
        error = await _failed(hub, await _delegate(hub, "worker@svc"))
        assert "307" in error
        assert len(srv.requests) == 1
        assert elsewhere.requests == []
    finally:
        await hub.close()


class _Held(Peer):
    """A service that takes each POST and answers 202 only once :attr:`go` is set."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.go = threading.Event()
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                peer.requests.append(self.path)
                peer.go.wait(30)
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.serve(Handler)


class _WallClock:
    """The wall clock, which the test steps by ``offset``."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset


async def test_a_post_under_way_when_the_clock_steps_forward_is_not_made_again() -> None:
    """The wall clock stepped an hour forward while a POST to another hub was under way
    (its job leased for one attempt's timeout): the next maintenance pass took the job
    for due and made the POST a second time beside the first. It keeps its lease now."""
    srv = _Held()
    clock = _WallClock()
    service = Service("hub-b", srv.url, "tok-b")
    retry = rules.RetryPolicy(start=0.05, factor=2, cap=0.2, budget=30, timeout=20)
    hub = Hub(
        MemoryStore(),
        clock=clock,
        callbacks=CallbackConfig(secret=SECRET, services={service.name: service}, retry=retry),
    )
    await hub.start()
    try:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "lead")
        await hub.open_session("t", "lead", "lead-s")
        await _delegate(hub, "worker@hub-b")
        await eventually(lambda: srv.requests, what="the POST to reach the service")
        await hub.maintain()

        clock.offset += 3600  # the wall clock is stepped forward an hour
        await hub.maintain()
        srv.go.set()
        await eventually(lambda: not hub.outbox._posts, what="every POST to end")
        assert len(srv.requests) == 1, srv.requests
    finally:
        srv.go.set()
        await hub.close()
        srv.close()
