"""Sending a batch as one call (``Hub.send_many``, under ``MemberApi.send_batch`` and
``POST /v1/messages/batch``): the items are stored in the order given, each is answered
with its result or its own error, and only the items that were stored have effects
(middleware hooks, wake-ups). Run on the memory store (the base ``transact_each``) and
on SQLite (the writer's grouped jobs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from backchannel.errors import InvalidRequest, MessageIdConflict, UnknownRecipient
from backchannel.hub import Hub, HubMiddleware, Outgoing
from backchannel.member import MemberApi
from backchannel.models import MAX_BATCH
from backchannel.stores.base import Store
from backchannel.stores.memory import MemoryStore
from backchannel.stores.sqlite import SqliteStore
from backchannel.types import Message, SendResult


@dataclass
class SendLog(HubMiddleware):
    sent: list[str] = field(default_factory=list)

    def after_send(self, hub: Hub, message: Message, result: SendResult) -> None:
        self.sent.append(message.message_id)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "hub.db")


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[tuple[Hub, SendLog]]:
    log = SendLog()
    async with Hub(store, background=False, middleware=[log]) as hub:
        await hub.create_team("t")
        for name in ("a", "b", "c"):
            await hub.add_member("t", name)
        yield hub, log


async def test_items_are_stored_in_order_and_each_answered_alone(
    rig: tuple[Hub, SendLog],
) -> None:
    hub, log = rig
    await hub.send("t", "a", "b", "first", message_id="m-0")
    items = [
        Outgoing("b", "one", message_id="m-1"),
        Outgoing("bad name!", "refused before the store"),
        Outgoing("b", "two", message_id="m-2"),
        Outgoing("nobody", "refused in the store"),
        Outgoing("b", "other content", message_id="m-0"),  # the id is taken
        Outgoing("b", "first", message_id="m-0"),  # a replay of the first send
        Outgoing("c", "three", message_id="m-3"),
        Outgoing("b", "four", message_id="m-4"),
    ]
    got = await hub.send_many("t", "a", items)

    assert len(got) == len(items)
    assert isinstance(got[1], InvalidRequest)
    assert isinstance(got[3], UnknownRecipient)
    assert isinstance(got[4], MessageIdConflict)
    sent = {i: r for i, r in enumerate(got) if isinstance(r, SendResult)}
    assert sorted(sent) == [0, 2, 5, 6, 7]
    assert [sent[i].message_id for i in (0, 2, 5, 6, 7)] == ["m-1", "m-2", "m-0", "m-3", "m-4"]
    assert sent[5].replayed and not any(sent[i].replayed for i in (0, 2, 6, 7))
    # only what was stored ran the after_send hooks, once each
    assert log.sent == ["m-0", "m-1", "m-2", "m-3", "m-4"]
    leased = await hub.receive("t", "b", limit=10)
    assert [m.message.message_id for m in leased] == ["m-0", "m-1", "m-2", "m-4"]
    assert [m.message.text for m in leased] == ["first", "one", "two", "four"]


async def test_a_waiting_receiver_is_woken_by_the_batch(rig: tuple[Hub, SendLog]) -> None:
    hub, _ = rig
    waiting = asyncio.create_task(hub.receive("t", "c", wait=30))
    await asyncio.sleep(0)  # the receive takes its wake-up event before its first await
    assert ("t", "c") in hub.env.waiters._events
    await hub.send_many("t", "a", [Outgoing("b", "not for c"), Outgoing("c", "for c")])
    got = await asyncio.wait_for(waiting, 10)
    assert [m.message.text for m in got] == ["for c"]


async def test_member_api_batch_keeps_item_order_and_statuses(rig: tuple[Hub, SendLog]) -> None:
    hub, _ = rig
    api = MemberApi(hub, await hub.get_member("t", "a"))
    items: Sequence[object] = [
        {"to": "b", "text": "one", "message_id": "x-1"},
        {"to": "b"},  # no text: refused by validation, alone
        {"to": "b", "text": "two", "message_id": "x-2"},
        {"to": "b", "text": "one", "message_id": "x-1"},  # replayed
    ]
    batch = await api.send_batch(items)
    assert [r.index for r in batch.results] == [0, 1, 2, 3]
    assert [r.status for r in batch.results] == [201, 422, 201, 200]
    assert batch.results[1].error is not None and "text" in batch.results[1].error.message
    assert (batch.sent, batch.failed) == (3, 1)
    leased = await hub.receive("t", "b", limit=10)
    assert [m.message.message_id for m in leased] == ["x-1", "x-2"]


async def test_an_empty_batch_is_answered_empty(rig: tuple[Hub, SendLog]) -> None:
    hub, log = rig
    assert await hub.send_many("t", "a", []) == []
    assert log.sent == []


async def test_an_in_process_batch_over_the_bound_is_refused_whole(
    rig: tuple[Hub, SendLog],
) -> None:
    """In-process callers get the bound the HTTP routes hold bodies to (1,000 items):
    refused before anything is sent, saying how to get through."""
    hub, log = rig
    api = MemberApi(hub, await hub.get_member("t", "a"))
    too_many = [{"to": "b", "text": f"m{i}"} for i in range(MAX_BATCH + 1)]
    with pytest.raises(InvalidRequest, match="split it"):
        await api.send_batch(too_many)
    with pytest.raises(InvalidRequest, match="split it"):
        await api.ack_batch([f"id-{i}" for i in range(MAX_BATCH + 1)])
    assert log.sent == []
    assert (await api.send_batch(too_many[:MAX_BATCH])).sent == MAX_BATCH
