"""The guards around loops besides the budget: which turns are checkpoints, when links end,
one copy of a text per recipient, and the heartbeat rules."""

from __future__ import annotations

from backchannel.core import timers
from backchannel.hub import Hub
from backchannel.runtimes.receiver import handle_hook
from backchannel.testing import FakeClock, MemoryStore
from backchannel.types import InboxMessage, LinkState, MessageKind


async def _take(hub: Hub, member: str, session: str | None = None) -> list[InboxMessage]:
    got = await hub.receive("t", member, session=session or f"{member}-s", limit=100)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return got


async def _linked(hub: Hub, clock: FakeClock, **member_settings: object) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "a", settings=dict(member_settings))
    await hub.add_member("t", "b")
    for m in ("a", "b"):
        await hub.open_session("t", m, f"{m}-s")
    await hub.report_event("t", "a", "a-s", "turn_start", "plan the work")
    await hub.send("t", "a", "b", "let's split the parser", sender_session="a-s")
    await hub.report_event("t", "a", "a-s", "agent_stop", "")
    await _take(hub, "a"), await _take(hub, "b")


# -- 4: only the hub's checkpoint makes a checkpoint turn ----------------------------------


async def test_a_humans_turn_after_a_pending_checkpoint_crosses_the_link(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _linked(hub, clock, checkpoint={"idle_seconds": 60, "text": "Where are you?"})
        clock.advance(61)
        await hub.maintain()
        [prompt] = await _take(hub, "a")
        assert prompt.message.kind is MessageKind.CHECKPOINT  # handed over: pending
        start = await hub.report_event("t", "a", "a-s", "turn_start", "implement the parser")
        assert start["checkpoint"] is False, "a human typed this turn's input"
        stop = await hub.report_event("t", "a", "a-s", "agent_stop", "parser implemented")
        assert [c["to"] for c in stop["crossed"]] == ["b"]
        assert [g.message.text for g in await _take(hub, "b")] == ["[From a] parser implemented"]


async def test_the_checkpoint_itself_still_makes_a_checkpoint_turn(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _linked(hub, clock, checkpoint={"idle_seconds": 60, "text": "Where are you?"})
        clock.advance(61)
        await hub.maintain()
        await _take(hub, "a")
        start = await hub.report_event("t", "a", "a-s", "turn_start", "[Hub] Where are you?")
        assert start["checkpoint"] is True
        stop = await hub.report_event("t", "a", "a-s", "agent_stop", "halfway")
        assert stop["crossed"] == []


async def test_a_prompt_typed_into_claude_code_after_a_checkpoint_crosses(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _linked(hub, clock, checkpoint={"idle_seconds": 60, "text": "Where are you?"})
        member = await hub.get_member("t", "a")
        clock.advance(61)
        await hub.maintain()
        await _take(hub, "a")  # the checkpoint reached the session (pending)
        base = {"session_id": "a-s", "cwd": "/w", "transcript_path": "/w/t.jsonl"}
        await handle_hook(
            hub,
            member,
            "claude-code",
            {**base, "hook_event_name": "UserPromptSubmit", "prompt": "implement the parser"},
        )
        await handle_hook(
            hub,
            member,
            "claude-code",
            {
                **base,
                "hook_event_name": "Stop",
                "stop_hook_active": False,
                "last_assistant_message": "parser implemented",
            },
        )
        assert [g.message.text for g in await _take(hub, "b")] == ["[From a] parser implemented"]


# -- 5: a link ends with the last live session of either side ---------------------------------


async def test_a_link_with_an_unbound_responder_closes_when_its_last_session_ends(
    clock: FakeClock,
) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        for m in ("a", "b"):
            await hub.add_member("t", m)
        await hub.open_session("t", "a", "a-s")
        for sid in ("b-1", "b-2"):  # two live sessions: the link cannot bind one yet
            await hub.open_session("t", "b", sid)
        await hub.report_event("t", "a", "a-s", "turn_start")
        await hub.send("t", "a", "b", "hello", sender_session="a-s")
        [link] = await hub.list_links("t")
        assert link.responder_session is None
        await hub.terminate_session("t", "b", "b-1")
        assert (await hub.get_link("t", link.link_id)).state is LinkState.OPEN
        await hub.terminate_session("t", "b", "b-2")
        closed = await hub.get_link("t", link.link_id)
        assert (closed.state, closed.close_reason) == (LinkState.CLOSED, "session_terminated")


async def test_every_runtimes_session_end_closes_the_link(clock: FakeClock) -> None:
    """A process exit alone keeps the link for the team's grace period (a resume carries
    on); once the grace has passed with no resume, the member has no live session left
    and the link closes, whether or not the responder ever bound a session."""
    for runtime in ("claude-code", "codex", "gemini"):
        async with Hub(MemoryStore(), clock=clock, background=False) as hub:
            settings = {"anchor_policy": "off", "exit_grace_seconds": 60}
            await hub.create_team("t", settings=settings)
            await hub.add_member("t", "a")
            b, _ = await hub.add_member("t", "b", runtime)
            await hub.open_session("t", "a", "a-s")
            await hub.report_event("t", "a", "a-s", "turn_start")
            await hub.send("t", "a", "b", "hello", sender_session="a-s")  # b has no session
            [link] = await hub.list_links("t")
            assert link.responder_session is None
            payload = {"session_id": "rt-1", "cwd": "/w", "transcript_path": "/w/t.jsonl"}
            await handle_hook(hub, b, runtime, {**payload, "hook_event_name": "SessionStart"})
            await handle_hook(hub, b, runtime, {**payload, "hook_event_name": "SessionEnd"})
            kept = await hub.get_link("t", link.link_id)
            assert kept.state is LinkState.OPEN, f"{runtime}: an exit alone keeps the link"
            clock.advance(61)
            await hub.maintain()
            closed = await hub.get_link("t", link.link_id)
            assert closed.state is LinkState.CLOSED, runtime


# -- 6: the same text once per recipient, broadcasts included -----------------------------------


async def test_a_closing_broadcast_does_not_repeat_a_tool_send(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        for m in ("w", "lead", "rev"):
            await hub.add_member("t", m)
            await hub.open_session("t", m, f"{m}-s")
        await hub.report_event("t", "w", "w-s", "turn_start")
        await hub.send("t", "w", "lead", "tests pass", sender_session="w-s", link=False)
        stop = await hub.report_event(
            "t", "w", "w-s", "agent_stop", '<message to="*">tests  pass</message>'
        )
        assert len(stop["sent"]) == 2  # expanded: one copy each for rev and user
        lead = [g.message.text for g in await _take(hub, "lead")]
        assert lead == ["tests pass"], "lead got it once"
        assert [g.message.text for g in await _take(hub, "rev")] == ["tests  pass"]
        user = [g.message.text for g in await hub.receive("t", "user", limit=10)]
        assert user == ["tests  pass"]
        # everyone already has it: the block is dropped as a whole
        await hub.report_event("t", "w", "w-s", "turn_start")
        await hub.send("t", "w", "*", "done", sender_session="w-s", link=False)
        stop = await hub.report_event(
            "t", "w", "w-s", "agent_stop", '<message to="*">done</message>'
        )
        assert (stop["sent"], stop["duplicates_dropped"]) == ([], ["*"])


# -- 7: heartbeat rules and anchors first ---------------------------------------------------------


async def test_both_sides_get_the_chattiness_and_heartbeat_rules(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        for m in ("a", "b"):
            await hub.add_member("t", m)
            await hub.open_session("t", m, f"{m}-s")
        await hub.report_event("t", "a", "a-s", "turn_start")
        await hub.send("t", "a", "b", "hi", sender_session="a-s")
        await hub.report_event("t", "a", "a-s", "agent_stop", "")
        for m in ("a", "b"):
            [rules] = [
                g.message.text for g in await _take(hub, m) if g.message.kind is MessageKind.SYSTEM
            ]
            for rule in (
                "contribute before acknowledging",
                "silence is valid",
                "always hold an anchor",
                f"minutes={timers.DEFAULT_ANCHOR_MINUTES}",
                "absorb what",
                "before you answer, set a new anchor",
                "when your anchor fires, it wins",
                "set a check timer instead of asking",
            ):
                assert rule in rules, (m, rule)


async def test_a_fired_anchor_comes_before_other_queued_input(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        for m in ("a", "b"):
            await hub.add_member("t", m)
        await hub.open_session("t", "a", "a-s")
        await hub.set_timer("t", "a", "a-s", "anchor", 60, "return to the report generator")
        await hub.send("t", "b", "a", "first, from b", link=False)
        await hub.send("t", "b", "a", "second, from b", link=False)
        clock.advance(60)
        await hub.maintain()
        await hub.send("t", "b", "a", "third, after the anchor fired", link=False)
        got = [g.message for g in await hub.receive("t", "a", session="a-s", limit=10)]
        assert got[0].kind is MessageKind.TIMER
        assert got[0].text.startswith("ANCHOR: return to the report generator")
        assert [m.text for m in got[1:]] == [
            "first, from b",
            "second, from b",
            "third, after the anchor fired",
        ]
