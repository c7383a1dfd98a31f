"""A send hands its message to a receive waiting in this process: the send's own
transaction leases it for that receive (``Takers``), which then returns it without a
store transaction of its own. Attacked where it can go wrong: two receives waiting
for one member, a batch, a send whose transaction fails after claiming a receive, a
receive cancelled while a send that claimed it is committing, a send cancelled while the
store's thread runs it, and receives that must never be handed anything (a session's, a
push dispatcher's)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import pytest

from backchannel.errors import StoreError
from backchannel.hub import Hub, Outgoing
from backchannel.stores.base import Store, Tx
from backchannel.testing import MemoryStore, eventually
from backchannel.types import SendResult

T = TypeVar("T")


class GatedStore(MemoryStore):
    """The memory store, counting transactions; it can fail the next one (rolled back)
    or hold its answer until ``gate`` opens (a commit in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions = 0
        self.attempts = 0  # of those, a receive's own lease attempts
        self.fail_next = False
        self.gate: asyncio.Event | None = None

    async def transact(self, fn: Callable[[Tx], T]) -> T:
        self.transactions += 1
        inner = getattr(fn, "fn", fn)  # Env's runner: its function
        if getattr(inner, "func", inner).__qualname__.endswith(".attempt"):
            self.attempts += 1
        failing, self.fail_next = self.fail_next, False

        def run(tx: Tx) -> T:
            value = fn(tx)
            if failing:
                raise StoreError("the database went away; retry shortly")
            return value

        result = await super().transact(run)
        if self.gate is not None:
            await self.gate.wait()
        return result


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    async with Hub(GatedStore()) as h:
        await h.create_team("t")
        for name in ("a", "b"):
            await h.add_member("t", name)
        yield h


def store(hub: Hub) -> GatedStore:
    s = hub.store
    assert isinstance(s, GatedStore)
    return s


async def waiting(hub: Hub, member: str = "b", **kw: object) -> asyncio.Task[list[str]]:
    """A receive of ``member`` that is waiting on its empty inbox."""

    async def receive() -> list[str]:
        got = await hub.receive("t", member, wait=30, **kw)  # type: ignore[arg-type]
        return [m.message.message_id for m in got]

    task = asyncio.ensure_future(receive())
    await eventually(lambda: ("t", member) in hub.env.takers._by_member, what="the receive waits")
    return task


async def test_a_waiting_receive_gets_the_message_in_the_sends_transaction(hub: Hub) -> None:
    task = await waiting(hub)
    assert hub.env.takers
    before = store(hub).attempts
    sent = await hub.send("t", "a", "b", "hello")
    assert await task == [sent.message_id]
    assert store(hub).attempts == before, "the receive made no transaction of its own"
    # it is leased to that receive: nobody else gets it, and its ack works
    assert await hub.receive("t", "b") == []
    assert (await hub.ack("t", "b", [sent.message_id])).acked == (sent.message_id,)
    assert not hub.env.takers


async def test_two_waiting_receives_get_one_message_each(hub: Hub) -> None:
    first = await waiting(hub)
    second = asyncio.ensure_future(hub.receive("t", "b", wait=30))
    await eventually(
        lambda: len(hub.env.takers._by_member.get(("t", "b"), [])) == 2, what="both wait"
    )
    one = await hub.send("t", "a", "b", "one")
    two = await hub.send("t", "a", "b", "two")
    got_first = await first
    got_second = [m.message.message_id for m in await second]
    assert got_first == [one.message_id], "the first to wait is handed the first message"
    assert got_second == [two.message_id]


async def test_a_batch_is_leased_whole_by_the_woken_receive(hub: Hub) -> None:
    task = await waiting(hub)
    sent = await hub.send_many("t", "a", [Outgoing("b", f"m{i}") for i in range(3)])
    ids = [r.message_id for r in sent if not isinstance(r, Exception)]
    assert await task == ids


async def test_a_send_that_fails_after_claiming_leaves_the_receive_waiting(hub: Hub) -> None:
    task = await waiting(hub)
    store(hub).fail_next = True
    with pytest.raises(StoreError):
        await hub.send("t", "a", "b", "lost in the failure")
    # the claim is answered with nothing and nothing woke the receive: it waits on, and
    # the next send wakes it to lease for itself
    assert not task.done()
    before = store(hub).attempts
    sent = await hub.send("t", "a", "b", "after")
    assert await task == [sent.message_id]
    assert store(hub).attempts - before == 1


async def test_a_receive_cancelled_while_a_claiming_send_commits_gives_it_back(hub: Hub) -> None:
    task = await waiting(hub)
    gate = store(hub).gate = asyncio.Event()
    sending = asyncio.ensure_future(hub.send("t", "a", "b", "in flight"))
    await eventually(lambda: not hub.env.takers, what="the send claimed the receive")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    store(hub).gate = None
    gate.set()
    sent = await sending
    # given back at once, not held for the 60 s lease: another receive gets it now
    got = await eventually(
        lambda: hub.receive("t", "b"), what="the message back in the inbox", within=10
    )
    assert [m.message.message_id for m in got] == [sent.message_id]
    history = await hub.store.read(lambda tx: tx.history("t", sent.message_id))
    assert [e.event for e in history].count("released") == 1


@pytest.mark.parametrize("batch", [False, True], ids=["send", "send_many"])
@pytest.mark.parametrize("make_store", ["sqlite", "postgres"], indirect=True)
async def test_a_send_cancelled_while_the_store_runs_it_answers_the_receive_it_claims(
    make_store: Callable[[], Store], batch: bool
) -> None:
    """The sender stops waiting (cancelled) while the store's thread runs its
    transaction, which then claims the waiting receive and commits: the receive gets
    the message at once (it never waits on a claim nobody answers, nor the lease)."""
    async with Hub(make_store()) as hub:
        await hub.create_team("t")
        for name in ("a", "b"):
            await hub.add_member("t", name)
        task = await waiting(hub)
        inside, go_on = threading.Event(), threading.Event()
        insert = hub.messages.pipeline.insert

        def held(*args: object) -> SendResult:  # on the store's thread
            inside.set()
            go_on.wait(10)
            return insert(*args)  # type: ignore[arg-type]

        hub.messages.pipeline.insert = held  # type: ignore[method-assign]
        text = "sent, then cancelled"
        sending = asyncio.ensure_future(
            hub.send_many("t", "a", [Outgoing("b", text)])
            if batch
            else hub.send("t", "a", "b", text)
        )
        await eventually(inside.is_set, what="the store runs the send's transaction")
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        go_on.set()
        got = await asyncio.wait_for(task, 10)
        assert len(got) == 1
        history = await hub.store.read(lambda tx: tx.history("t", got[0]))
        assert [e.event for e in history] == ["queued", "leased"]
        assert (await hub.ack("t", "b", got)).acked == tuple(got)


async def test_a_sessions_receive_and_a_dispatchers_are_never_handed_anything(hub: Hub) -> None:
    await hub.open_session("t", "b", "b-main")
    for kw in ({"session": "b-main"}, {"owner": "hub-1"}):
        task = asyncio.ensure_future(hub.receive("t", "b", wait=0.3, **kw))  # type: ignore[arg-type]
        while not task.done():  # never offered, the whole time it waits
            assert not hub.env.takers
            await asyncio.sleep(0.01)
        assert await task == []
