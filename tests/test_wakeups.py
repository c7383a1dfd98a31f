"""Blocked receivers are woken for their own member's messages, not for the whole team's
traffic; those watching the team (feed, events, tasks) still wake on all of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, MemoryStore
from backchannel.types import InboxMessage


@pytest.fixture(params=["memory", "sqlite"])
async def hub(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Hub]:
    # SQLite runs transaction functions on its writer thread: what they record of the
    # members they stored messages for must come back from there too
    store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "hub.db")
    h = Hub(store, clock=FakeClock(), background=False)
    async with h:
        await h.create_team("t", settings={"anchor_policy": "off"})
        for m in ("a", "b", "c"):
            await h.add_member("t", m)
        yield h


async def _blocked(
    hub: Hub, member: str, session: str | None = None
) -> asyncio.Task[list[InboxMessage]]:
    """A receiver of ``member`` in a long wait, once its wake-up event is in place (a
    wake-up after that point, spurious or not, would end its wait and be counted). The
    receive takes its event before its first await: one pass of the loop is enough."""
    task = asyncio.create_task(hub.receive("t", member, session=session, limit=10, wait=60))
    await asyncio.sleep(0)
    assert ("t", member) in hub._waiters._events
    return task


def _woken(hub: Hub, member: str | None) -> int:
    return hub._waiters.woken[("t", member)]


async def test_a_receiver_is_not_woken_by_another_members_traffic(hub: Hub) -> None:
    task = await _blocked(hub, "a")
    watched = hub._waiters.event("t", None)  # a watcher of the team's traffic

    # b's session, a turn with a tool call and a closing text, a send to b, its ack,
    # the session's exit and its end: all of it b's traffic in a's team
    await hub.open_session("t", "b", "b-s")
    await hub.report_event("t", "b", "b-s", "turn_start", "go")
    assert watched.is_set(), "the team's watchers wake on its events"
    await hub.report_event("t", "b", "b-s", "tool_call", "ls", {"tool": "bash"})
    await hub.report_event("t", "b", "b-s", "agent_stop", "done")
    await hub.send("t", "c", "b", "for b")
    got = await hub.receive("t", "b", limit=10)
    await hub.ack("t", "b", [g.message.message_id for g in got])
    await hub.exit_session("t", "b", "b-s")
    await hub.terminate_session("t", "b", "b-s")

    assert _woken(hub, "a") == 0
    assert not task.done()
    assert _woken(hub, None) >= 1

    await hub.send("t", "c", "a", "for a")
    [msg] = await asyncio.wait_for(task, 10)
    assert msg.message.text == "for a"
    assert _woken(hub, "a") == 1


async def test_a_notice_stored_by_another_members_change_wakes_its_receiver(hub: Hub) -> None:
    # a's link with b closes when b's session terminates: a is told by a system
    # message that b's change stored, and a's blocked receiver wakes for it
    for m in ("a", "b"):
        await hub.open_session("t", m, f"{m}-s")
    await hub.report_event("t", "a", "a-s", "turn_start")
    await hub.send("t", "a", "b", "let's talk", sender_session="a-s")
    await hub.report_event("t", "a", "a-s", "agent_stop", "")
    got = await hub.receive("t", "a", session="a-s", limit=100)
    await hub.ack("t", "a", [g.message.message_id for g in got])

    task = await _blocked(hub, "a", "a-s")
    await hub.terminate_session("t", "b", "b-s")
    [msg] = await asyncio.wait_for(task, 10)
    assert msg.message.text == "Your link with b is closed: a session on it terminated."
    assert _woken(hub, "a") == 1


async def test_the_closing_text_wakes_only_its_recipient(hub: Hub) -> None:
    await hub.open_session("t", "b", "b-s")
    task_a = await _blocked(hub, "a")
    task_c = await _blocked(hub, "c")
    await hub.report_event("t", "b", "b-s", "turn_start", "go")
    await hub.report_event("t", "b", "b-s", "agent_stop", '<message to="c">hello c</message>')
    [msg] = await asyncio.wait_for(task_c, 10)
    assert msg.message.text == "hello c"
    assert _woken(hub, "a") == 0
    assert not task_a.done()
    task_a.cancel()
    await asyncio.gather(task_a, return_exceptions=True)
