"""A member that ran for months opened a session at every ``/clear``, ``/new`` and
restart: what its runtime does every few seconds (the MCP server's beat), at each start
(``SessionStart``) and a timer set without a session reads its live sessions, not
every one it ever had. Counted in records the store hands out, not timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from backchannel.client import Client
from backchannel.hub import Hub
from backchannel.runner.host import Runner
from backchannel.runner.teamfile import parse_team
from backchannel.runtimes.common import RUNTIME_FIELD
from backchannel.runtimes.receiver import handle_hook
from backchannel.stores.base import Store, Tx
from backchannel.stores.memory import MemoryStore
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, counting_rows
from backchannel.types import Session, SessionState

ENDED = 400
KEY = "proc:4242:1700000000"


async def _long_lived(hub: Hub, *, team: bool = True) -> None:
    if team:
        await hub.create_team("t")
        await hub.add_member("t", "a")

    def history(tx: Tx) -> None:
        for i in range(ENDED):
            at = float(i)
            tx.put_session(Session("t", f"old-{i}", "a", SessionState.TERMINATED, at, at))

    await hub.store.transact(history)


async def _member_client(hub: Hub) -> Client:
    """Team ``t`` made through the SDK in-process, and member ``a``'s client, started."""
    admin = Client.local(hub)
    await admin.start()
    await admin.create_team("t")
    a = Client.local(hub, (await admin.add_member("t", "a")).token)
    await a.start()
    return a


def _runner(a: Client) -> Runner:
    """A runner hosting ``a`` (its model never called here)."""
    team = parse_team("team: t\nmembers:\n  - {name: a, policy: 'tests.test_runner:_stuck'}\n")
    return Runner(team, {"a": a}, workspace=Path("."))


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> Store:
    if request.param == "memory":
        return MemoryStore()
    return SqliteStore(f"{tmp_path}/hub.db")


async def test_a_start_a_beat_and_a_timer_read_the_live_sessions(store: Store) -> None:
    async with Hub(store, clock=FakeClock(), background=False) as hub:
        await _long_lived(hub)
        member = await hub.get_member("t", "a")
        start = {
            "hook_event_name": "SessionStart",
            "session_id": "now",
            "source": "startup",
            "cwd": "/w",
            "transcript_path": "/w/t.jsonl",
            RUNTIME_FIELD: KEY,
        }
        with counting_rows(hub.store) as read:
            await handle_hook(hub, member, "claude-code", start)
        assert read["Session"] < ENDED // 4, read
        with counting_rows(hub.store) as read:
            vouched, _ = await hub.runtime_alive("t", "a", KEY)
        assert read["Session"] < ENDED // 4, read
        assert vouched == ["now"]
        with counting_rows(hub.store) as read:
            timer = await hub.set_timer("t", "a", None, "anchor", 60, "back to task 3")
        assert read["Session"] < ENDED // 4, read
        assert timer.session == "now"


async def test_a_session_end_and_a_check_timer_on_its_member_read_the_live_sessions(
    store: Store,
) -> None:
    """A session's end (every ``/clear``) looked through every session its member ever
    had for a live one, to know whether its links close; a ``check`` timer on that
    member, firing, read them all to say how it is. Both read its live sessions (and, for
    a member with none, its latest few) now."""
    clock = FakeClock()
    async with Hub(store, clock=clock, background=False) as hub:
        await _long_lived(hub)
        await hub.add_member("t", "b")
        await hub.open_session("t", "b", "b-s")
        await hub.open_session("t", "a", "now")
        await hub.set_timer("t", "b", "b-s", "check", 60, "how is a doing", target="a")
        with counting_rows(hub.store) as read:
            await hub.terminate_session("t", "a", "now", "done")
        assert read["Session"] < ENDED // 4, read
        clock.advance(61)
        with counting_rows(hub.store) as read:
            await hub.maintain()
        assert read["Session"] < ENDED // 4, read
        got = await hub.receive("t", "b", session="b-s")
        [fired] = [g.message for g in got if g.message.meta.get("timer_id")]
        assert "a is terminated (session now" in fired.text, fired.text


async def test_pruning_a_teams_delegations_reads_one_left_to_know_it_goes_on(
    store: Store,
) -> None:
    """The job that forgets old delegations asked whether any were left by reading every
    one the team keeps (a week's); it reads one now."""
    from backchannel.core.delegation import PRUNE_INTERVAL, PRUNE_JOB
    from backchannel.types import Delegation, Job, Route

    clock = FakeClock()
    async with Hub(store, clock=clock, background=False) as hub:
        await _long_lived(hub)
        now = clock.now()

        def kept(tx: Tx) -> None:
            for i in range(ENDED):
                tx.insert_delegation(
                    Delegation("t", f"d{i}", Route.LOCAL, "a", "old-1", f"tu_{i}", "a",
                               "count", now, now + 300, f"old-1#{i}")
                )  # fmt: skip
            tx.add_job(Job("t", PRUNE_JOB, now + PRUNE_INTERVAL, now, None, {}))

        await hub.store.transact(kept)
        clock.advance(PRUNE_INTERVAL + 1)
        with counting_rows(hub.store) as read:
            await hub.maintain()
        assert read["Job"] >= 1, read  # the job ran
        assert read["Delegation"] < ENDED // 4, read
        left = await hub.list_delegations("t", limit=ENDED + 1)
        assert len(left) == ENDED, "none had ended: all kept"


async def test_the_runner_looks_for_its_members_live_sessions(store: Store) -> None:
    """The runner looks for its members' sessions (the sub-sessions delegations open)
    five times a second, and read every session each member ever had, a page of 500 at
    a time: a long run leaves one ended for each delegation. It asks for the live ones."""
    async with Hub(store, clock=FakeClock(), background=False) as hub:
        worker = await _member_client(hub)
        await _long_lived(hub, team=False)
        await worker.open_session("a-main")
        runner = _runner(worker)
        try:
            with counting_rows(hub.store) as read:
                await runner._discover()
            assert read["Session"] < ENDED // 4, read
            assert list(runner.loops) == ["a-main"]
        finally:
            for task in runner.tasks.values():
                task.cancel()


async def test_the_mcp_servers_members_and_a_members_session_read_the_live_sessions(
    store: Store,
) -> None:
    """The MCP server's ``list_members`` read every session the team ever had (a page of
    500 at a time) to show each member's open ones, and ``session_data`` given a member's
    name read every session of that member to find its latest: both read the live ones."""
    from backchannel.interfaces import mcp

    async with Hub(store, clock=FakeClock(), background=False) as hub:
        a = await _member_client(hub)
        await _long_lived(hub, team=False)
        await a.open_session("now")
        agent = mcp.Agent(a, "t", "a", "now")
        with counting_rows(hub.store) as read:
            listed, _ = await mcp._list_members(agent, mcp.ListMembersArgs())
        assert read["Session"] < ENDED // 4, read
        assert "- a (you), llm; sessions: now (idle)" in listed, listed
        with counting_rows(hub.store) as read:
            shown, _ = await mcp._session_data(agent, mcp.SessionDataArgs(session="a"))
        assert read["Session"] < ENDED // 4, read
        assert shown.startswith("Session now of a: idle"), shown


async def test_the_runner_asks_whether_a_delegation_is_pending_by_reading_one(
    store: Store,
) -> None:
    """While its agents are idle the runner asks five times a second whether anything is
    still owed to them; it read every delegation each member was in (a week's) to find
    one pending. It reads at most one now."""
    from backchannel.types import Delegation, DelegationState, Route

    async with Hub(store, clock=FakeClock(), background=False) as hub:
        worker = await _member_client(hub)
        await hub.add_member("t", "b")
        now = hub.clock.now()

        def answered(tx: Tx) -> None:
            for i in range(ENDED):
                tx.insert_delegation(
                    Delegation("t", f"d{i}", Route.LOCAL, "a", "a-s", f"tu_{i}", "b", "count",
                               now, now + 300, f"a-s#{i}", state=DelegationState.ANSWERED,
                               answered_at=now + 1)
                )  # fmt: skip

        await hub.store.transact(answered)
        runner = _runner(worker)
        with counting_rows(hub.store) as read:
            assert await runner._busy() is False
        assert read["Delegation"] < ENDED // 4, read
