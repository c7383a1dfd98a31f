"""Sessions, turns, closing-text routing, the per-turn ledger, checkpoints, transcripts."""

from __future__ import annotations

import pytest

from backchannel.core import turns
from backchannel.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    InvalidState,
    UnknownSession,
)
from backchannel.hub import Hub
from backchannel.testing import FakeClock, MemoryStore
from backchannel.types import EventKind, LedgerEntry, MessageKind, SessionState


async def _setup(hub: Hub, *members: str) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})  # tested in test_timers
    for m in members:
        await hub.add_member("t", m)


async def _texts(hub: Hub, member: str, session: str | None = None) -> list[str]:
    """The direct messages the member got (notices and link crossings left out)."""
    got = await hub.receive("t", member, session=session, limit=100)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return [g.message.text for g in got if g.message.kind is MessageKind.DIRECT]


async def _events(hub: Hub, session: str) -> list[tuple[str, str]]:
    data = await hub.get_session_data("t", session)
    return [(e["kind"], e["text"]) for e in data["events"]]


async def test_turn_lifecycle_states_and_timestamps(hub: Hub, clock: FakeClock) -> None:
    await _setup(hub, "a")
    s = await hub.open_session("t", "a", "a-1")
    assert s.state is SessionState.IDLE
    clock.advance(5)
    r = await hub.report_event("t", "a", "a-1", "turn_start", "do the thing")
    assert (r["turn"], r["retried"]) == (1, False)
    s = await hub.get_session("t", "a-1")
    assert s.state is SessionState.ACTIVE
    assert s.turn_started_at == clock.now()
    await hub.report_event("t", "a", "a-1", "thought", "thinking...")
    await hub.report_event("t", "a", "a-1", "tool_call", "ls", {"tool": "bash"})
    clock.advance(2)
    stop = await hub.report_event("t", "a", "a-1", "agent_stop", "all done")
    assert stop["output"] == "all done"
    s = await hub.get_session("t", "a-1")
    assert (s.state, s.last_output, s.last_stop_at) == (SessionState.IDLE, "all done", clock.now())
    done = await hub.terminate_session("t", "a", "a-1", "finished")
    assert done.state is SessionState.TERMINATED


async def test_a_report_made_again_under_its_request_id_is_answered_and_not_done_again(
    hub: Hub,
) -> None:
    await _setup(hub, "a", "b")
    await hub.open_session("t", "a", "a-1")
    first = await hub.report_event("t", "a", "a-1", "turn_start", "go", request_id="r1")
    again = await hub.report_event("t", "a", "a-1", "turn_start", "go", request_id="r1")
    assert again == {**first, "replayed": True}
    stop = '<message to="b">ship it</message> done'
    first = await hub.report_event("t", "a", "a-1", "agent_stop", stop, request_id="r2")
    again = await hub.report_event("t", "a", "a-1", "agent_stop", stop, request_id="r2")
    assert again == {**first, "replayed": True}
    assert await _texts(hub, "b") == ["ship it"]
    assert [k for k, _ in await _events(hub, "a-1")].count("agent_stop") == 1
    # the same id for another kind of report is a mistake, said so
    with pytest.raises(Conflict, match="'r2' was already used for the agent_stop report"):
        await hub.report_event("t", "a", "a-1", "turn_start", "go", request_id="r2")


async def test_resume_keeps_the_session(hub: Hub) -> None:
    await _setup(hub, "a")
    first = await hub.open_session("t", "a", "a-1")
    await hub.report_event("t", "a", "a-1", "turn_start")
    await hub.report_event("t", "a", "a-1", "agent_stop", "one")
    again = await hub.open_session("t", "a", "a-1")
    assert (again.created_at, again.turn, again.last_output) == (first.created_at, 1, "one")


async def test_message_for_a_busy_session_waits_for_the_turn_to_end(hub: Hub) -> None:
    await _setup(hub, "a", "b")
    await hub.open_session("t", "b", "b-1")
    await hub.report_event("t", "b", "b-1", "turn_start")
    r = await hub.send("t", "a", "b", "while you work", to_session="b-1")
    assert await hub.receive("t", "b", session="b-1") == []  # never mid-turn
    status = await hub.message_status("t", r.message_id)
    assert status.state.value == "queued"  # not marked delivered before it could be seen
    await hub.report_event("t", "b", "b-1", "agent_stop", "ok")
    got = await hub.receive("t", "b", session="b-1")
    assert [g.message.text for g in got] == ["while you work"]
    kinds = [k for k, _ in await _events(hub, "b-1")]
    assert kinds[-1] == "input"


async def test_closing_blocks_are_sends_and_the_rest_is_output(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    stop = await hub.report_event(
        "t",
        "w",
        "w-1",
        "agent_stop",
        'Counted everything.\n<message to="lead">total: 42 files</message>',
    )
    assert stop["output"] == "Counted everything."
    assert len(stop["sent"]) == 1
    assert await _texts(hub, "lead") == ["total: 42 files"]
    status = await hub.message_status("t", stop["sent"][0])
    assert status.message.sender == "w"
    assert status.message.sender_session == "w-1"


async def test_closing_blocks_of_a_long_session_id_are_all_sent(hub: Hub) -> None:
    """A session id of up to 200 characters: each block of each turn is its own
    message, never one id cut short for all of them."""
    await _setup(hub, "w", "a", "b")
    sid = "w-" + "x" * 198
    await hub.open_session("t", "w", sid)
    for turn in ("one", "two"):
        await hub.report_event("t", "w", sid, "turn_start")
        stop = await hub.report_event(
            "t", "w", sid, "agent_stop",
            f'<message to="a">{turn} for a</message><message to="b">{turn} for b</message>',
        )  # fmt: skip
        assert len(set(stop["sent"])) == 2
        assert all(len(mid) <= 128 for mid in stop["sent"])
    assert await _texts(hub, "a") == ["one for a", "two for a"]
    assert await _texts(hub, "b") == ["one for b", "two for b"]


async def test_block_to_unknown_destination_is_reported_back_never_dropped(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    stop = await hub.report_event(
        "t", "w", "w-1", "agent_stop", '<message to="laed">result</message>'
    )
    assert stop["unknown_destinations"] == ["laed"]
    got = await hub.receive("t", "w", session="w-1")
    assert len(got) == 1
    notice = got[0].message
    assert notice.kind is MessageKind.SYSTEM
    assert "'laed'" in notice.text
    assert "Did you mean 'lead'" in notice.text
    assert "Known members: lead, user" in notice.text
    assert notice.meta["body"] == "result"  # the text is not lost


# -- the ledger: cases from the field ------------------------------------------------


async def _turn_with_tool_sends(hub: Hub, sends: list[str], closing: str) -> dict[str, object]:
    await hub.report_event("t", "w", "w-1", "turn_start")
    for text in sends:
        await hub.send("t", "w", "lead", text, sender_session="w-1")
    return await hub.report_event("t", "w", "w-1", "agent_stop", closing)


async def test_verbatim_duplicate_is_suppressed(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    stop = await _turn_with_tool_sends(
        hub, ["The answer is 42."], '<message to="lead">The answer is 42.</message>'
    )
    assert stop["duplicates_dropped"] == ["lead"]
    assert await _texts(hub, "lead") == ["The answer is 42."]
    events = await _events(hub, "w-1")
    assert any(
        k == "duplicate_dropped" and "already sent the same text to lead" in t for k, t in events
    )


async def test_progress_update_then_different_final_answer_both_flow(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await _turn_with_tool_sends(
        hub,
        ["on it, looking at your calendar"],
        '<message to="lead">You are free at 3pm.</message>',
    )
    assert await _texts(hub, "lead") == ["on it, looking at your calendar", "You are free at 3pm."]


@pytest.mark.parametrize("closing", ["hello\nworld", "  hello world ", "hello   world"])
async def test_whitespace_variants_count_as_the_same(hub: Hub, closing: str) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await _turn_with_tool_sends(hub, ["hello world"], f'<message to="lead">{closing}</message>')
    assert await _texts(hub, "lead") == ["hello world"]


async def test_two_payloads_only_the_repeated_one_is_suppressed(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await _turn_with_tool_sends(
        hub,
        ["payload one", "payload two"],
        '<message to="lead">payload two</message><message to="lead">payload three</message>',
    )
    assert await _texts(hub, "lead") == ["payload one", "payload two", "payload three"]


async def test_the_same_text_to_another_member_flows(hub: Hub) -> None:
    await _setup(hub, "lead", "rev", "w")
    await hub.open_session("t", "w", "w-1")
    await _turn_with_tool_sends(hub, ["totals: 42"], '<message to="rev">totals: 42</message>')
    assert await _texts(hub, "rev") == ["totals: 42"]


async def _ledger(hub: Hub, session: str) -> list[str]:
    """The texts' recipients the stored ledger holds for ``session``."""
    return [e.to for e in await hub.store.read(lambda tx: tx.ledger("t", session))]


async def test_the_duplicate_check_is_case_sensitive(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    stop = await _turn_with_tool_sends(
        hub, ["Build is green."], '<message to="lead">build is GREEN.</message>'
    )
    assert stop["duplicates_dropped"] == []
    assert await _texts(hub, "lead") == ["Build is green.", "build is GREEN."]


async def test_turn_start_clears_a_ledger_left_behind(hub: Hub, clock: FakeClock) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    # an entry no boundary cleared (say, written by a version that did not clear it)
    left = LedgerEntry("t", "w-1", "lead", turns.digest("status: green"), "old", clock.now())
    await hub.store.transact(lambda tx: tx.ledger_add(left))
    await hub.report_event("t", "w", "w-1", "turn_start")
    assert await _ledger(hub, "w-1") == []
    await hub.report_event(
        "t", "w", "w-1", "agent_stop", '<message to="lead">status: green</message>'
    )
    assert await _texts(hub, "lead") == ["status: green"]


async def test_agent_stop_leaves_no_ledger_behind(hub: Hub) -> None:
    """A session that never runs another turn (a delegation's sub-session) must not keep
    its last turn's ledger: agent_stop clears it, not only the next turn_start."""
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.send("t", "w", "lead", "status: green", sender_session="w-1")
    assert await _ledger(hub, "w-1") == ["lead"]
    await hub.report_event("t", "w", "w-1", "agent_stop", "done")
    assert await _ledger(hub, "w-1") == []


async def test_recovering_a_crashed_session_clears_its_ledger_at_once(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.send("t", "w", "lead", "half done", sender_session="w-1")
    assert await _ledger(hub, "w-1") == ["lead"]
    await hub.open_session("t", "w", "w-1")  # a new process resumes the session
    assert await _ledger(hub, "w-1") == [], "cleared by the recovery, before any new turn"


async def test_terminating_a_session_clears_its_ledger(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.send("t", "w", "lead", "bye", sender_session="w-1")
    await hub.terminate_session("t", "w", "w-1", "done")
    assert await _ledger(hub, "w-1") == []


async def test_ledger_is_cleared_after_the_turn(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await _turn_with_tool_sends(hub, ["status: green"], "done")
    await _turn_with_tool_sends(hub, [], '<message to="lead">status: green</message>')
    assert await _texts(hub, "lead") == ["status: green", "status: green"]


async def test_retried_turn_clears_the_ledger(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.send("t", "w", "lead", "partial result", sender_session="w-1")
    retry = await hub.report_event("t", "w", "w-1", "turn_start")  # the runtime retried the turn
    assert retry["retried"] is True
    await hub.report_event(
        "t", "w", "w-1", "agent_stop", '<message to="lead">partial result</message>'
    )
    assert await _texts(hub, "lead") == ["partial result", "partial result"]


async def test_crash_recovery_clears_the_ledger(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.send("t", "w", "lead", "half done", sender_session="w-1")
    # the agent's process died mid-turn; a new process resumes the session
    resumed = await hub.open_session("t", "w", "w-1")
    assert resumed.state is SessionState.IDLE
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.report_event("t", "w", "w-1", "agent_stop", '<message to="lead">half done</message>')
    assert await _texts(hub, "lead") == ["half done", "half done"]
    assert any("recovered" in t for k, t in await _events(hub, "w-1") if k == "session")


async def test_send_without_session_belongs_to_the_members_only_open_turn(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.open_session("t", "w", "w-2")  # idle: does not count
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.send("t", "w", "lead", "via the tool")  # e.g. an MCP send_message call
    await hub.report_event(
        "t", "w", "w-1", "agent_stop", '<message to="lead">via the tool</message>'
    )
    assert await _texts(hub, "lead") == ["via the tool"]


async def test_reactions_do_not_feed_the_ledger(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    r = await hub.send("t", "lead", "w", "nice work?")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.react("t", "w", r.message_id, "👍")
    await hub.report_event("t", "w", "w-1", "agent_stop", '<message to="lead">👍</message>')
    assert await _texts(hub, "lead") == ["👍"]
    history = (await hub.message_status("t", r.message_id)).history
    assert (history[-1].event, history[-1].detail) == ("reaction", "👍")


async def test_a_reaction_made_again_is_there_once(hub: Hub) -> None:
    await _setup(hub, "lead", "w")
    r = await hub.send("t", "lead", "w", "nice work?")
    for who, emoji in [("w", "👍"), ("w", "👍"), ("w", "🎉"), ("lead", "👍")]:
        await hub.react("t", who, r.message_id, emoji)
    history = (await hub.message_status("t", r.message_id)).history
    reactions = [(h.member, h.detail) for h in history if h.event == "reaction"]
    assert reactions == [("w", "👍"), ("w", "🎉"), ("lead", "👍")]


# -- bad input ------------------------------------------------------------------------


async def test_bad_events_are_refused_and_nothing_is_recorded(hub: Hub) -> None:
    await _setup(hub, "a", "b")
    await hub.open_session("t", "a", "a-1")
    with pytest.raises(UnknownSession, match="unknown session 'nope'"):
        await hub.report_event("t", "a", "nope", "turn_start")
    with pytest.raises(InvalidState, match=r"no turn is open.*report turn_start before agent_stop"):
        await hub.report_event("t", "a", "a-1", "agent_stop", '<message to="b">x</message>')
    with pytest.raises(InvalidState, match="no turn is open"):
        await hub.report_event("t", "a", "a-1", "thought", "hmm")
    with pytest.raises(Forbidden, match="belongs to 'a', not 'b'"):
        await hub.report_event("t", "b", "a-1", "turn_start")
    with pytest.raises(InvalidRequest, match="unknown event kind 'finish'"):
        await hub.report_event("t", "a", "a-1", "finish")
    with pytest.raises(InvalidRequest, match="recorded by the hub"):
        await hub.report_event("t", "a", "a-1", "duplicate_dropped")
    assert await _texts(hub, "b") == []
    assert [k for k, _ in await _events(hub, "a-1")] == ["session"]
    await hub.terminate_session("t", "a", "a-1")
    with pytest.raises(InvalidState, match="terminated"):
        await hub.report_event("t", "a", "a-1", "turn_start")
    with pytest.raises(InvalidState, match="terminated"):
        await hub.open_session("t", "a", "a-1")


# -- checkpoints ------------------------------------------------------------------------


async def test_checkpoint_prompt_after_idle_and_its_turn_is_marked(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t")
        await hub.add_member(
            "t", "w", settings={"checkpoint": {"idle_seconds": 300, "text": "Where are you?"}}
        )
        await hub.add_member("t", "quiet")  # no policy: never prompted
        for m in ("w", "quiet"):
            await hub.open_session("t", m, f"{m}-1")
            await hub.report_event("t", m, f"{m}-1", "turn_start")
            await hub.report_event("t", m, f"{m}-1", "agent_stop", "working on it")
        clock.advance(299)
        await hub.maintain()
        assert await hub.receive("t", "w", session="w-1") == []
        clock.advance(1)
        await hub.maintain()
        got = await hub.receive("t", "w", session="w-1")
        assert [(g.message.kind, g.message.text) for g in got] == [
            (MessageKind.CHECKPOINT, "Where are you?")
        ]
        await hub.ack("t", "w", [got[0].message.message_id])
        assert await hub.receive("t", "quiet", session="quiet-1") == []
        start = await hub.report_event("t", "w", "w-1", "turn_start")
        assert start["checkpoint"] is True
        await hub.report_event("t", "w", "w-1", "agent_stop", "still counting")
        s = await hub.get_session("t", "w-1")
        assert s.last_output == "working on it", "a checkpoint answer is not the turn's output"
        clock.advance(10_000)
        await hub.maintain()
        assert await hub.receive("t", "w", session="w-1") == [], "no checkpoint after a checkpoint"


async def test_checkpoint_is_cancelled_by_a_new_turn(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t")
        await hub.add_member("t", "w", settings={"checkpoint": {"idle_seconds": 60}})
        await hub.open_session("t", "w", "w-1")
        await hub.report_event("t", "w", "w-1", "turn_start")
        await hub.report_event("t", "w", "w-1", "agent_stop", "one")
        clock.advance(30)
        await hub.report_event("t", "w", "w-1", "turn_start")
        clock.advance(60)
        await hub.maintain()
        await hub.report_event("t", "w", "w-1", "agent_stop", "two")
        assert await hub.receive("t", "w", session="w-1") == []


# -- transcripts --------------------------------------------------------------------------


async def test_get_session_data_pages_and_caps(hub: Hub) -> None:
    await _setup(hub, "w", "peer")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start", "task")
    for i in range(10):
        await hub.report_event("t", "w", "w-1", "thought", f"thought {i} " + "x" * 100)
    await hub.report_event("t", "w", "w-1", "agent_stop", "final")
    full = await hub.get_session_data("t", "w-1")
    kinds = [e["kind"] for e in full["events"]]
    assert kinds[:2] == ["session", "turn_start"]
    assert kinds.count("thought") == 10
    assert kinds[-1] == "agent_stop"
    assert full["truncated"] is False
    capped = await hub.get_session_data("t", "w-1", max_chars=350)
    assert capped["truncated"] is True
    assert "call again with since=" in capped["note"]
    rest = await hub.get_session_data("t", "w-1", since=capped["next_since"])
    assert [e["event_id"] for e in capped["events"] + rest["events"]] == [
        e["event_id"] for e in full["events"]
    ]
    tail = await hub.get_session_data("t", "w-1", tail_chars=120)
    assert tail["events"][-1]["text"] == "final"
    assert sum(len(e["text"]) for e in tail["events"]) <= 120 + len("[…cut…] ")
    assert "earlier event(s) cut" in tail["note"]


async def test_get_session_data_refused_across_teams(hub: Hub) -> None:
    await _setup(hub, "w")
    await hub.create_team("other")
    await hub.open_session("t", "w", "w-1")
    with pytest.raises(UnknownSession):
        await hub.get_session_data("other", "w-1")


async def test_events_are_the_private_transcript(hub: Hub) -> None:
    await _setup(hub, "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start")
    await hub.report_event(
        "t", "w", "w-1", "tool_call", "grep TODO", {"tool": "bash", "id": "tu_1"}
    )
    await hub.report_event("t", "w", "w-1", "tool_result", "3 matches", {"id": "tu_1"})
    await hub.report_event("t", "w", "w-1", "agent_output", "partial")
    data = await hub.get_session_data("t", "w-1")
    tool = next(e for e in data["events"] if e["kind"] == EventKind.TOOL_CALL.value)
    assert tool["data"] == {"tool": "bash", "id": "tu_1"}
    assert tool["turn"] == 1
