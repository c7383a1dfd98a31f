"""A receive that acks first: the member's finished messages are acked in the same store
transaction as the first lease attempt, committed before any wait; ids not held fail
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
import pytest

from backchannel import Client
from backchannel.client import HttpTransport
from backchannel.errors import InvalidRequest, UnknownSession
from backchannel.hub import AckResult, Hub, HubMiddleware
from backchannel.interfaces.http import create_app
from backchannel.stores.base import Tx
from backchannel.stores.memory import MemoryStore
from backchannel.testing import FakeClock
from backchannel.types import DeliveryState

T = TypeVar("T")
ADMIN = "admin-token"


class CountingStore(MemoryStore):
    """The memory store, counting its write transactions."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions = 0

    async def transact(self, fn: Callable[[Tx], T]) -> T:
        self.transactions += 1
        return await super().transact(fn)


@dataclass
class AckLog(HubMiddleware):
    """Every committed ack, and an event set by the next one."""

    acks: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    next_ack: asyncio.Event = field(default_factory=asyncio.Event)

    def after_ack(self, hub: Hub, team: str, member: str, message_ids: Sequence[str]) -> None:
        self.acks.append((team, member, tuple(message_ids)))
        self.next_ack.set()


@dataclass
class Rig:
    hub: Hub
    store: CountingStore
    log: AckLog
    http: httpx.AsyncClient
    tokens: dict[str, str]

    def auth(self, member: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[member]}"}

    def over_http(self, member: str) -> Client:
        transport = httpx.ASGITransport(app=self.http._transport.app)  # type: ignore[attr-defined]
        return Client.over(HttpTransport("http://hub", self.tokens[member], transport=transport))

    def in_process(self, member: str) -> Client:
        return Client.local(self.hub, self.tokens[member])

    async def send(self, n: int, to: str = "b") -> list[str]:
        return [(await self.hub.send("t", "a", to, f"m{i}")).message_id for i in range(n)]

    async def state(self, message_id: str) -> DeliveryState:
        return (await self.hub.message_status("t", message_id)).state


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    store, log = CountingStore(), AckLog()
    hub = Hub(store, clock=FakeClock(), background=False, middleware=[log])
    await hub.start()
    app = create_app(hub, ADMIN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://hub"
    ) as http:
        admin = Client.local(hub)
        await admin.start()
        team = await admin.create_team("t")
        tokens = {"user": team.user_token}
        for name in ("a", "b", "c"):
            tokens[name] = (await admin.add_member("t", name)).token
        yield Rig(hub, store, log, http, tokens)
    await hub.close()


# -- the hub ------------------------------------------------------------------------------


async def test_the_ack_and_the_lease_are_one_store_transaction(rig: Rig) -> None:
    m0, m1, m2 = await rig.send(3)
    first = await rig.hub.receive("t", "b", limit=1)
    assert [g.message.message_id for g in first] == [m0]
    assert first.acked == AckResult((), ())
    before = rig.store.transactions
    got = await rig.hub.receive("t", "b", limit=10, ack=[m0])
    assert rig.store.transactions == before + 1
    assert [g.message.message_id for g in got] == [m1, m2]
    assert got.acked == AckResult((m0,), ())
    assert await rig.state(m0) is DeliveryState.ACKED
    # the ack's after-commit effects are those of a plain ack, once
    assert rig.log.acks == [("t", "b", (m0,))]
    # a plain receive is one transaction, as before
    before = rig.store.transactions
    assert await rig.hub.receive("t", "b") == []
    assert rig.store.transactions == before + 1


async def test_ids_not_held_are_reported_and_fail_nothing(rig: Rig) -> None:
    m0, m1 = await rig.send(2)
    [c0] = await rig.send(1, to="c")
    await rig.hub.receive("t", "b", limit=1)
    got = await rig.hub.receive("t", "b", ack=[m0, c0, "nope", m1, m0])
    # m1 was queued when the ack ran: not held, then leased by the same receive
    assert got.acked == AckResult((m0,), (c0, "nope", m1))
    assert [g.message.message_id for g in got] == [m1]
    assert await rig.state(c0) is DeliveryState.QUEUED
    only_unknown = await rig.hub.receive("t", "b", ack=["gone-1"])
    assert only_unknown == [] and only_unknown.acked == AckResult((), ("gone-1",))
    assert rig.log.acks == [("t", "b", (m0,))]


async def test_too_many_ids_or_a_failed_receive_ack_nothing(rig: Rig) -> None:
    [m0] = await rig.send(1)
    await rig.hub.receive("t", "b")
    with pytest.raises(InvalidRequest, match="at most 1000") as exc:
        await rig.hub.receive("t", "b", ack=[m0] * 1001)
    assert exc.value.details["field"] == "ack"
    with pytest.raises(UnknownSession):
        await rig.hub.receive("t", "b", session="not-mine", ack=[m0])
    assert await rig.state(m0) is DeliveryState.LEASED
    assert rig.log.acks == []


async def test_a_waiting_receive_committed_its_ack_before_the_wait(rig: Rig) -> None:
    [m0] = await rig.send(1)
    await rig.hub.receive("t", "b")
    waiting = asyncio.create_task(rig.hub.receive("t", "b", wait=60, ack=[m0]))
    await asyncio.wait_for(rig.log.next_ack.wait(), 5)
    # the sender sees the ack while the receive still waits for a message
    assert (await rig.hub.message_status("t", m0, viewer="a")).state is DeliveryState.ACKED
    assert not waiting.done()
    [m1] = await rig.send(1)
    got = await asyncio.wait_for(waiting, 5)  # woken by the send, far below 60 s
    assert [g.message.message_id for g in got] == [m1]
    assert got.acked == AckResult((m0,), ())
    assert rig.log.acks == [("t", "b", (m0,))]  # the lease after the wake acked nothing
