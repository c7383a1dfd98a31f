"""Sessions across processes: an exited session keeps its links, timers and ledger for
the team's exit grace; a resume is the same session; the grace's end terminates it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest

from backchannel.errors import InvalidRequest, InvalidState
from backchannel.hub import Hub
from backchannel.hub.sessions import DEFAULT_EXIT_GRACE_S, SILENT_JOB
from backchannel.stores.base import Store
from backchannel.testing import FakeClock
from backchannel.types import LinkState, MessageKind, SessionState


async def _team(hub: Hub, settings: dict[str, object] | None = None) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off", **(settings or {})})
    for m in ("a", "b"):
        await hub.add_member("t", m)
        await hub.open_session("t", m, f"{m}-s")


async def _link(hub: Hub) -> None:
    await hub.report_event("t", "a", "a-s", "turn_start")
    await hub.send("t", "a", "b", "let's talk", sender_session="a-s")
    await hub.report_event("t", "a", "a-s", "agent_stop", "")


async def _texts(hub: Hub, member: str) -> list[str]:
    got = await hub.receive("t", member, session=f"{member}-s", limit=100)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return [g.message.text for g in got if g.message.kind is not MessageKind.SYSTEM]


async def test_an_exit_keeps_the_link_and_a_resume_is_the_same_session(hub: Hub) -> None:
    await _team(hub)
    await _link(hub)
    await hub.report_event("t", "a", "a-s", "turn_start")
    exited = await hub.exit_session("t", "a", "a-s", "claude-code SessionEnd")
    assert exited.state is SessionState.EXITED
    assert (await hub.exit_session("t", "a", "a-s")).state is SessionState.EXITED  # idempotent
    [link] = await hub.list_links("t")
    assert link.state is LinkState.OPEN

    # the peer answers over the link while a is away: it waits in a's inbox
    await hub.report_event("t", "b", "b-s", "turn_start")
    await hub.report_event("t", "b", "b-s", "agent_stop", "here is my answer")

    resumed = await hub.open_session("t", "a", "a-s")
    assert (resumed.session_id, resumed.state) == ("a-s", SessionState.IDLE)
    assert any("here is my answer" in t for t in await _texts(hub, "a"))
    [link] = await hub.list_links("t")
    assert link.state is LinkState.OPEN


async def test_an_event_of_the_same_runtime_session_resumes_it(hub: Hub) -> None:
    await _team(hub)
    await hub.exit_session("t", "a", "a-s")
    await hub.report_event("t", "a", "a-s", "turn_start", "again")
    assert (await hub.get_session("t", "a-s")).state is SessionState.ACTIVE


async def test_the_grace_ends_the_session_and_closes_its_links(hub: Hub, clock: FakeClock) -> None:
    await _team(hub, {"exit_grace_seconds": 600})
    await _link(hub)
    await hub.exit_session("t", "a", "a-s")
    clock.advance(599)
    await hub.maintain()
    assert (await hub.get_session("t", "a-s")).state is SessionState.EXITED
    clock.advance(1)
    await hub.maintain()
    assert (await hub.get_session("t", "a-s")).state is SessionState.TERMINATED
    [link] = await hub.list_links("t")
    assert link.state is LinkState.CLOSED
    try:
        await hub.open_session("t", "a", "a-s")
    except InvalidState:
        pass
    else:
        raise AssertionError("a terminated session cannot be resumed")


async def test_a_resume_within_the_grace_cancels_its_end(hub: Hub, clock: FakeClock) -> None:
    await _team(hub)
    await _link(hub)
    await hub.exit_session("t", "a", "a-s")
    clock.advance(DEFAULT_EXIT_GRACE_S / 2)
    await hub.open_session("t", "a", "a-s")
    clock.advance(DEFAULT_EXIT_GRACE_S)
    await hub.maintain()
    assert (await hub.get_session("t", "a-s")).state is SessionState.IDLE
    [link] = await hub.list_links("t")
    assert link.state is LinkState.OPEN


async def test_a_timer_due_while_exited_is_handed_over_on_resume(
    hub: Hub, clock: FakeClock
) -> None:
    await _team(hub)
    await hub.set_timer("t", "a", "a-s", "anchor", 60, "check the build")
    await hub.exit_session("t", "a", "a-s")
    clock.advance(61)
    await hub.maintain()
    await hub.open_session("t", "a", "a-s")
    assert any("check the build" in t for t in await _texts(hub, "a"))


async def test_an_explicit_terminate_ends_an_exited_session(hub: Hub) -> None:
    await _team(hub)
    await _link(hub)
    await hub.exit_session("t", "a", "a-s")
    await hub.terminate_session("t", "a", "a-s", "done")
    assert (await hub.get_session("t", "a-s")).state is SessionState.TERMINATED
    [link] = await hub.list_links("t")
    assert link.state is LinkState.CLOSED


@pytest.mark.parametrize("bad", [-1, "soon", True, 10**9])
async def test_a_bad_exit_grace_is_refused_with_its_range(hub: Hub, bad: object) -> None:
    with pytest.raises(InvalidRequest, match=r"exit_grace_seconds .*30 days"):
        await hub.create_team("t", settings={"exit_grace_seconds": bad})


async def test_what_waits_for_a_session_that_ends_goes_to_its_member(
    hub: Hub, clock: FakeClock
) -> None:
    """Nothing can lease for a terminated session: what was pinned to it (waiting, or
    leased and given back later) and what is sent to it afterwards reach the member's
    next session instead of waiting forever."""
    await _team(hub, {"exit_grace_seconds": 600})
    await _link(hub)
    held = await hub.send("t", "b", "a", "leased when it ended", to_session="a-s")
    got = await hub.receive("t", "a", session="a-s", limit=100, lease_seconds=3600)
    others = [g.message.message_id for g in got if g.message.message_id != held.message_id]
    await hub.ack("t", "a", others)
    await hub.exit_session("t", "a", "a-s")
    # the peer's turn crosses the link while a is away: pinned to a's session
    await hub.report_event("t", "b", "b-s", "turn_start")
    await hub.report_event("t", "b", "b-s", "agent_stop", "here is my answer")
    clock.advance(600)
    await hub.maintain()
    assert (await hub.get_session("t", "a-s")).state is SessionState.TERMINATED
    assert await hub.release("t", "a", [held.message_id]) == 1
    late = await hub.send("t", "b", "a", "sent after it ended", to_session="a-s")
    await hub.open_session("t", "a", "a-s.2")
    got2 = await hub.receive("t", "a", session="a-s.2", limit=100)
    texts = [g.message.text for g in got2 if g.message.kind is not MessageKind.SYSTEM]
    assert texts[0] == "leased when it ended"
    assert any("here is my answer" in t for t in texts)
    assert texts[-1] == "sent after it ended"
    assert {held.message_id, late.message_id} <= {g.message.message_id for g in got2}


@pytest.fixture
async def store_hub(make_store: Callable[[], Store], clock: FakeClock) -> AsyncIterator[Hub]:
    """A hub on each store (memory, SQLite, PostgreSQL)."""
    async with Hub(make_store(), clock=clock, background=False, lease_seconds=30) as h:
        yield h


async def _silent_team(hub: Hub) -> None:
    """``a`` and ``b`` linked; ``b``'s runtime then dies without a ``SessionEnd`` (a
    crash, ``kill -9``) and comes back under a new runtime session id, ``b-s2``."""
    await _team(hub, {"exit_grace_seconds": 600})
    await _link(hub)
    await _texts(hub, "b")  # the link's rules
    await hub.open_session("t", "b", "b-s2")


async def _cross(hub: Hub, text: str) -> None:
    await hub.report_event("t", "a", "a-s", "turn_start")
    await hub.report_event("t", "a", "a-s", "agent_stop", text)


async def _taken(hub: Hub, member: str, session: str) -> list[str]:
    got = await hub.receive("t", member, session=session, limit=100)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return [g.message.text for g in got]


async def test_a_crossing_to_a_session_that_died_silently_reaches_the_new_one(
    store_hub: Hub, clock: FakeClock
) -> None:
    """A crossing pinned to a session nobody runs any more waited forever: never
    delivered, never a dead letter, and its sender never heard. A session that shows no
    sign of life for the exit grace while a message waits for it has gone as an exited
    one does: it ends, its links close with both sides told, and what waited for it goes
    to its member's live session."""
    await _silent_team(store_hub)
    await _cross(store_hub, "a's words")
    assert not any("a's words" in t for t in await _taken(store_hub, "b", "b-s2"))
    clock.advance(599)
    await store_hub.maintain()
    assert (await store_hub.get_session("t", "b-s")).state is SessionState.IDLE
    clock.advance(1)
    await store_hub.maintain()
    assert (await store_hub.get_session("t", "b-s")).state is SessionState.TERMINATED
    got = await _taken(store_hub, "b", "b-s2")
    assert sum("a's words" in t for t in got) == 1, got
    [link] = await store_hub.list_links("t")
    assert (link.state, link.close_reason) == (LinkState.CLOSED, "session_silent")
    told = await _taken(store_hub, "a", "a-s")
    assert any("closed" in t and "no sign of life" in t for t in told), told
    assert await _taken(store_hub, "b", "b-s2") == []  # once


async def test_a_session_that_shows_life_keeps_what_waits_for_it(
    store_hub: Hub, clock: FakeClock
) -> None:
    """A peer in a long turn (tool calls going on) or an idle session with nothing
    waiting for it is alive: neither ends, however long it takes."""
    await _silent_team(store_hub)
    await store_hub.report_event("t", "b", "b-s", "turn_start")
    await _cross(store_hub, "a's words")  # waits for b-s's turn to end
    for _ in range(6):
        clock.advance(300)
        await store_hub.report_event("t", "b", "b-s", "tool_call", "make build")
        await store_hub.maintain()
    assert (await store_hub.get_session("t", "b-s")).state is SessionState.ACTIVE
    await store_hub.report_event("t", "b", "b-s", "agent_stop", "")
    assert sum("a's words" in t for t in await _taken(store_hub, "b", "b-s")) == 1
    clock.advance(86_400)  # idle for a day with nothing waiting: still b's session
    await store_hub.maintain()
    assert (await store_hub.get_session("t", "b-s")).state is SessionState.IDLE
    [link] = await store_hub.list_links("t")
    assert link.state is LinkState.OPEN


async def test_a_session_resumed_while_a_message_waits_for_it_is_watched_again(
    store_hub: Hub, clock: FakeClock
) -> None:
    """A crossing came while ``b``'s session had exited (no watch: an exited session has
    its own end); the runtime resumed it and was then killed before it took anything.
    Nothing watched the resumed session, so the crossing waited for ever. A resume
    with something waiting for the session watches it again."""
    await _silent_team(store_hub)
    await store_hub.exit_session("t", "b", "b-s")
    await _cross(store_hub, "a's words")  # waits for b-s to come back
    await store_hub.open_session("t", "b", "b-s")  # resumed, then killed: no event
    assert (await store_hub.get_session("t", "b-s")).state is SessionState.IDLE
    clock.advance(600)
    await store_hub.maintain()
    assert (await store_hub.get_session("t", "b-s")).state is SessionState.TERMINATED
    got = await _taken(store_hub, "b", "b-s2")
    assert sum("a's words" in t for t in got) == 1, got
    [link] = await store_hub.list_links("t")
    assert (link.state, link.close_reason) == (LinkState.CLOSED, "session_silent")


async def _watches(hub: Hub, session: str) -> int:
    jobs = await hub.store.read(lambda tx: tx.list_jobs("t", session_id=session, kind=SILENT_JOB))
    return len(jobs)


async def test_a_session_terminated_early_drops_its_watch(store_hub: Hub, clock: FakeClock) -> None:
    """A session ended for good before its ``session_silent`` watch fell due kept the
    watch pending until then, an hour by default, for nothing."""
    await _silent_team(store_hub)
    await _cross(store_hub, "a's words")
    assert await _watches(store_hub, "b-s") == 1
    await store_hub.terminate_session("t", "b", "b-s", "done")
    assert await _watches(store_hub, "b-s") == 0


RUNTIME = "boot/4242/1000"  # a runtime process, as the command hook names it


async def _beating(hub: Hub, clock: FakeClock, seconds: float) -> None:
    """The runtime's MCP server beats for ``seconds``, as often as the hub asks."""
    end = clock.now() + seconds
    while clock.now() < end:
        kept, every = await hub.runtime_alive("t", "b", RUNTIME)
        assert kept == ["b-s"]
        clock.advance(every)
        await hub.maintain()


@pytest.mark.parametrize("busy", [False, True], ids=["idle at its prompt", "in a long tool call"])
async def test_a_runtime_that_runs_keeps_its_silent_session(
    store_hub: Hub, clock: FakeClock, busy: bool
) -> None:
    """A runtime left idle at its prompt, or in one tool call longer than the exit grace,
    reports no event; its MCP server's beats keep its session, links and what waits for
    it. Once the beats stop (the runtime was killed), the rule ends it as before."""
    await _silent_team(store_hub)
    await store_hub.note_runtime("t", "b", "b-s", RUNTIME)
    if busy:
        await store_hub.report_event("t", "b", "b-s", "turn_start")
        await store_hub.report_event("t", "b", "b-s", "tool_call", "make build")
    await _cross(store_hub, "a's words")
    await _beating(store_hub, clock, 3 * 600)
    s = await store_hub.get_session("t", "b-s")
    assert s.state is (SessionState.ACTIVE if busy else SessionState.IDLE)
    [link] = await store_hub.list_links("t")
    assert link.state is LinkState.OPEN
    if busy:
        await store_hub.report_event("t", "b", "b-s", "agent_stop", "")
    assert sum("a's words" in t for t in await _taken(store_hub, "b", "b-s")) == 1

    await _cross(store_hub, "more words")  # then the runtime is killed: no more beats
    clock.advance(600)
    await store_hub.maintain()
    assert (await store_hub.get_session("t", "b-s")).state is SessionState.TERMINATED
    [link] = await store_hub.list_links("t")
    assert (link.state, link.close_reason) == (LinkState.CLOSED, "session_silent")


async def test_a_beat_keeps_only_the_live_sessions_of_its_runtime(
    store_hub: Hub, clock: FakeClock
) -> None:
    """Another runtime's beat, or this one's for a session that exited (a ``/clear``
    leaves the old session exited in the same process), keeps nothing."""
    await _silent_team(store_hub)
    await store_hub.note_runtime("t", "b", "b-s", RUNTIME)
    await store_hub.note_runtime("t", "b", "b-s2", "boot/4243/1000")
    assert (await store_hub.runtime_alive("t", "b", "boot/9999/1"))[0] == []
    assert (await store_hub.runtime_alive("t", "a", RUNTIME))[0] == []  # not a's
    # nothing waits for it: the beat vouches for it and writes nothing
    before = (await store_hub.get_session("t", "b-s")).updated_at
    clock.advance(120)
    assert (await store_hub.runtime_alive("t", "b", RUNTIME))[0] == ["b-s"]
    assert (await store_hub.get_session("t", "b-s")).updated_at == before
    await store_hub.exit_session("t", "b", "b-s")
    assert (await store_hub.runtime_alive("t", "b", RUNTIME))[0] == []
    assert (await store_hub.runtime_alive("t", "b", "boot/4243/1000"))[0] == ["b-s2"]


class _WallClock:
    """The wall clock, which the test steps by ``offset``."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset


async def test_a_clock_stepped_forward_ends_no_session_as_silent(
    make_store: Callable[[], Store],
) -> None:
    """The wall clock stepped an hour forward while a crossing waited for a session: the
    hour was skipped, not spent in silence, so the session is not ended as a silent one
    (nor its link closed) at the next pass: its silence counts from the step."""
    clock = _WallClock()
    async with Hub(make_store(), clock=clock, background=False, lease_seconds=30) as hub:
        await _silent_team(hub)
        await _cross(hub, "a's words")
        await hub.maintain()
        clock.offset += 3600  # the wall clock is stepped forward an hour
        await hub.maintain()
        assert (await hub.get_session("t", "b-s")).state is SessionState.IDLE
        [link] = await hub.list_links("t")
        assert link.state is LinkState.OPEN
