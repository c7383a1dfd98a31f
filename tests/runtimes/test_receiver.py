"""Hook calls of each runtime against an in-process hub: the event mapping, between-turn
delivery as the stop hook's answer, the loop guard, and bad input."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from backchannel.core.messages import current_session
from backchannel.hub import Hub
from backchannel.runtimes import HookKind, get_runtime
from backchannel.runtimes.liveness import runtime_keys
from backchannel.testing import FakeClock
from backchannel.types import MessageKind, SessionState

from .helpers import FIXTURES, PROMPT_EVENT, SEQUENCES, STOP_EVENT, call, fixture, session_of

RUNTIMES = list(SEQUENCES)
RUNNING = (SessionState.IDLE, SessionState.ACTIVE)


async def _team(hub: Hub, runtime: str = "claude-code") -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "w", runtime)
    await hub.add_member("t", "lead")


async def _kinds(hub: Hub, sid: str) -> list[tuple[str, str, dict[str, Any]]]:
    data = await hub.get_session_data("t", sid)
    return [
        (e["kind"], e["text"], e["data"])
        for e in data["events"]
        if e["kind"] not in ("input", "sent", "routing_error")
    ]


async def _texts(hub: Hub, member: str, session: str | None = None) -> list[str]:
    got = await hub.receive("t", member, session=session, limit=100)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return [g.message.text for g in got]


def _stop(runtime: str, **changes: Any) -> dict[str, Any]:
    return fixture(runtime, STOP_EVENT[runtime], **changes)


def _reason(runtime: str, answer: dict[str, Any]) -> str:
    decision = "deny" if runtime == "gemini" else "block"
    assert answer["decision"] == decision, answer
    return str(answer["reason"])


# -- the mapping -------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_fixture_parses_to_its_kind(runtime: str) -> None:
    kinds = {
        "SessionStart": HookKind.SESSION_START,
        "UserPromptSubmit": HookKind.PROMPT,
        "BeforeAgent": HookKind.PROMPT,
        "PreToolUse": HookKind.TOOL_CALL,
        "BeforeTool": HookKind.TOOL_CALL,
        "PostToolUse": HookKind.TOOL_RESULT,
        "AfterTool": HookKind.TOOL_RESULT,
        "Stop": HookKind.STOP,
        "AfterAgent": HookKind.STOP,
        "SubagentStop": HookKind.SUBAGENT_STOP,
        "SessionEnd": HookKind.SESSION_END,
    }
    rt = get_runtime(runtime)
    for name in SEQUENCES[runtime]:
        event = rt.parse(fixture(runtime, name))
        assert (event.kind, event.name, event.session_id) == (
            kinds[name],
            name,
            session_of(runtime),
        )
    assert set(rt.events) == set(SEQUENCES[runtime])


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_whole_session_maps_to_hub_events(hub: Hub, runtime: str) -> None:
    await _team(hub, runtime)
    sid = session_of(runtime)
    answers = {}
    for name in SEQUENCES[runtime]:
        result = await call(hub, "t", "w", runtime, fixture(runtime, name))
        assert result.problem is None, (name, result.problem)
        assert result.session == sid
        answers[name] = result.answer
    intro = answers["SessionStart"]["hookSpecificOutput"]
    assert intro["hookEventName"] == "SessionStart"
    assert "you are 'w' in team 't'" in intro["additionalContext"]
    assert all(a == {} for n, a in answers.items() if n != "SessionStart")

    events = await _kinds(hub, sid)
    kinds = [k for k, _, _ in events]
    expected = ["session", "turn_start", "tool_call", "tool_result"]
    expected += ["agent_output"] if runtime == "claude-code" else []
    expected += ["agent_stop"]
    expected += ["session"] if "SessionEnd" in SEQUENCES[runtime] else []
    assert kinds == expected
    by_kind = {k: (t, d) for k, t, d in events}
    prompt = fixture(runtime, PROMPT_EVENT[runtime])["prompt"]
    assert by_kind["turn_start"][0] == prompt
    call_text, call_data = by_kind["tool_call"]
    assert call_data["tool"] in ("Bash", "run_shell_command")
    assert call_text.startswith(call_data["tool"]) and '"command"' in call_text
    assert by_kind["tool_result"][0]  # the tool's output, as text
    if "id" in call_data:
        assert by_kind["tool_result"][1]["id"] == call_data["id"]
    stop = _stop(runtime)
    closing = stop.get("last_assistant_message") or stop.get("prompt_response")
    assert by_kind["agent_stop"][0] == closing
    s = await hub.get_session("t", sid)
    ended = "SessionEnd" in SEQUENCES[runtime]
    assert s.state is (SessionState.EXITED if ended else SessionState.IDLE)


# -- between-turn delivery -------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_peers_message_is_the_stop_answer_and_opens_the_next_turn(
    hub: Hub, runtime: str
) -> None:
    await _team(hub, runtime)
    sid = session_of(runtime)
    await call(hub, "t", "w", runtime, fixture(runtime, "SessionStart"))
    await call(hub, "t", "w", runtime, fixture(runtime, PROMPT_EVENT[runtime]))
    sent = await hub.send("t", "lead", "w", "also count the tests")
    result = await call(hub, "t", "w", runtime, _stop(runtime))
    reason = _reason(runtime, result.answer)
    assert "[From lead] also count the tests" in reason
    assert result.delivered == (sent.message_id,)
    # handed over, not yet taken in: leased until the runtime's next event shows it
    assert (await hub.message_status("t", sent.message_id)).state.value == "leased"
    s = await hub.get_session("t", sid)
    assert s.state is SessionState.ACTIVE  # the runtime goes on with that input
    last = (await _kinds(hub, sid))[-1]
    assert (last[0], last[2]["continued_by"]) == ("turn_start", STOP_EVENT[runtime])
    again = await call(hub, "t", "w", runtime, _stop(runtime, stop_hook_active=True))
    assert again.answer == {}
    assert (await hub.get_session("t", sid)).state is SessionState.IDLE
    status = await hub.message_status("t", sent.message_id)
    assert status.state.value == "acked"
    assert [h.event for h in status.history][-2:] == ["leased", "acked"]


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_stop_answer_fits_the_hook_cap_and_long_messages_name_read_message(
    hub: Hub, runtime: str
) -> None:
    """Three messages of 20,000 characters each were one 60,000-character stop answer
    (Claude Code shows the model a 2 KB preview of a hook text past 10,000, Codex cuts
    its middle out), all counted delivered. Each answer now fits the cap: one message's
    start, with the read_message call that reads it whole; the next waits for the next
    answer."""
    from backchannel.runtimes.receiver import HOOK_BYTES

    await _team(hub, runtime)
    await call(hub, "t", "w", runtime, fixture(runtime, "SessionStart"))
    await call(hub, "t", "w", runtime, fixture(runtime, PROMPT_EVENT[runtime]))
    # more than a message's attempts: none is handed out and given back at every answer
    texts = [f"REPORT {n}\n" + f"row of report {n}\n" * 1400 + f"END {n}" for n in range(1, 9)]
    sent = [await hub.send("t", "lead", "w", t) for t in texts]
    for n, one in enumerate(sent):
        result = await call(hub, "t", "w", runtime, _stop(runtime, stop_hook_active=n > 0))
        reason = _reason(runtime, result.answer)
        assert len(reason.encode()) <= HOOK_BYTES, len(reason.encode())
        assert result.delivered == (one.message_id,)
        assert f"[From lead] REPORT {n + 1}\nrow of report" in reason
        said = f"read_message with message_id={one.message_id!r}"
        assert said in reason and f"END {n + 1}" not in reason
    result = await call(hub, "t", "w", runtime, _stop(runtime, stop_hook_active=True))
    assert result.answer == {}
    for one in sent:
        status = await hub.message_status("t", one.message_id)
        assert status.state.value == "acked"
        assert max(d.attempts for d in status.deliveries) <= 2, status.deliveries


async def test_the_stop_hook_never_loops(hub: Hub) -> None:
    await _team(hub)
    sid = session_of("claude-code")
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit"))
    await hub.send("t", "lead", "w", "one")
    first = await call(hub, "t", "w", "claude-code", _stop("claude-code"))
    assert "[From lead] one" in _reason("claude-code", first.answer)
    # a peer's message that arrived during the continuation keeps it going
    await hub.send("t", "lead", "w", "two")
    second = await call(hub, "t", "w", "claude-code", _stop("claude-code", stop_hook_active=True))
    assert "[From lead] two" in _reason("claude-code", second.answer)
    # a continuation whose only news is the hub's own notice (caused by this very stop)
    # does not go on again
    bogus = 'Sent.\n<message to="nobody">x</message>'
    third = await call(
        hub,
        "t",
        "w",
        "claude-code",
        _stop("claude-code", stop_hook_active=True, last_assistant_message=bogus),
    )
    assert third.answer == {}
    assert (await hub.get_session("t", sid)).state is SessionState.IDLE
    # the notice is not lost: it comes with the next prompt
    prompt = await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit"))
    context = prompt.answer["hookSpecificOutput"]["additionalContext"]
    assert "[backchannel]" in context and "'nobody'" in context


async def test_notices_alone_do_not_start_a_turn(hub: Hub) -> None:
    await _team(hub)
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit"))
    bogus = '<message to="nobody">x</message>'
    result = await call(
        hub, "t", "w", "claude-code", _stop("claude-code", last_assistant_message=bogus)
    )
    assert result.answer == {}
    got = await hub.receive("t", "w", session=session_of("claude-code"))
    assert [g.message.kind for g in got] == [MessageKind.SYSTEM]


@pytest.mark.parametrize("runtime", ["claude-code", "gemini"])
async def test_the_prompt_hook_hands_over_waiting_messages(hub: Hub, runtime: str) -> None:
    await _team(hub, runtime)
    await call(hub, "t", "w", runtime, fixture(runtime, "SessionStart"))
    sent = await hub.send("t", "lead", "w", "the build is red")
    result = await call(hub, "t", "w", runtime, fixture(runtime, PROMPT_EVENT[runtime]))
    out = result.answer["hookSpecificOutput"]
    assert out["hookEventName"] == PROMPT_EVENT[runtime]
    assert "[From lead] the build is red" in out["additionalContext"]
    assert (await hub.message_status("t", sent.message_id)).state.value == "leased"
    await call(hub, "t", "w", runtime, _stop(runtime))  # the turn ran with it
    assert (await hub.message_status("t", sent.message_id)).state.value == "acked"


async def test_a_timer_breadcrumb_arrives_as_the_stop_answer(hub: Hub, clock: FakeClock) -> None:
    await _team(hub)
    sid = session_of("claude-code")
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit"))
    await hub.set_timer("t", "w", sid, "anchor", 60, "finish the line count")
    clock.advance(61)
    await hub.maintain()
    result = await call(hub, "t", "w", "claude-code", _stop("claude-code"))
    assert "ANCHOR: finish the line count" in _reason("claude-code", result.answer)


async def test_subagent_stop_never_delivers(hub: Hub) -> None:
    await _team(hub)
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit"))
    await hub.send("t", "lead", "w", "waits for the main agent")
    result = await call(hub, "t", "w", "claude-code", fixture("claude-code", "SubagentStop"))
    assert (result.answer, result.problem) == ({}, None)
    assert await _texts(hub, "w") == ["waits for the main agent"]


async def test_compaction_between_turns_leaves_the_session_idle_for_the_next_prompt(
    hub: Hub,
) -> None:
    """``/compact`` runs Claude Code's summary agent while the session waits at its prompt,
    and its ``SubagentStop`` comes outside any turn: it opens none, so the session stays
    idle and a message waiting meanwhile comes with the next prompt (and a channel push
    may still wake it), not only after that prompt's turn."""
    await _team(hub)
    sid = session_of("claude-code")
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart"))
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit"))
    await call(hub, "t", "w", "claude-code", _stop("claude-code", last_assistant_message="Ok."))
    await hub.send("t", "lead", "w", "waits for the next prompt")
    summary = fixture(
        "claude-code", "SubagentStop", agent_type="", last_assistant_message="<summary>..."
    )
    result = await call(hub, "t", "w", "claude-code", summary)
    assert (result.answer, result.problem) == ({}, None)
    assert (await hub.get_session("t", sid)).state is SessionState.IDLE
    compacted = fixture("claude-code", "SessionStart", source="compact")
    await call(hub, "t", "w", "claude-code", compacted)
    result = await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit"))
    context = result.answer["hookSpecificOutput"]["additionalContext"]
    assert "[From lead] waits for the next prompt" in context
    assert [k for k, _, _ in await _kinds(hub, sid)].count("agent_output") == 0


# -- runtimes that are not tidy ---------------------------------------------------------------


async def test_a_stop_outside_a_turn_opens_one_and_routes_its_closing_text(hub: Hub) -> None:
    await _team(hub)
    sid = session_of("claude-code")
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart"))
    closing = 'Done.\n<message to="lead">420 lines</message>'
    result = await call(
        hub, "t", "w", "claude-code", _stop("claude-code", last_assistant_message=closing)
    )
    assert result.problem is None
    assert await _texts(hub, "lead") == ["420 lines"]
    starts = [d for k, _, d in await _kinds(hub, sid) if k == "turn_start"]
    assert starts[0]["opened_by"] == "Stop"


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_tool_result_outside_a_turn_opens_one(hub: Hub, runtime: str) -> None:
    await _team(hub, runtime)
    name = "AfterTool" if runtime == "gemini" else "PostToolUse"
    result = await call(hub, "t", "w", runtime, fixture(runtime, name))  # unknown session too
    assert result.problem is None
    sid = session_of(runtime)
    assert (await hub.get_session("t", sid)).state is SessionState.ACTIVE
    kinds = [(k, d.get("opened_by")) for k, _, d in await _kinds(hub, sid)]
    assert kinds[:3] == [("session", None), ("turn_start", name), ("tool_result", None)]


async def test_codex_notify_reports_the_finished_turn(hub: Hub) -> None:
    await _team(hub, "codex")
    await hub.send("t", "lead", "w", "cannot ride on notify")
    payload = fixture("codex", "notify")
    result = await call(hub, "t", "w", "codex", payload)
    assert (result.answer, result.problem) == ({}, None)
    events = await _kinds(hub, payload["thread-id"])
    assert [k for k, _, _ in events] == ["session", "turn_start", "agent_stop"]
    assert events[1][1] == "Rename foo to bar and update the callers."
    assert await _texts(hub, "lead") == ["foo is now bar"]
    assert await _texts(hub, "w") == ["cannot ride on notify"]  # still waiting


async def test_a_resumed_session_after_its_exit_is_the_same_session(hub: Hub) -> None:
    await _team(hub)
    sid = session_of("claude-code")
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart"))
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "SessionEnd"))
    assert (await hub.get_session("t", sid)).state is SessionState.EXITED
    resumed = await call(
        hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart", source="resume")
    )
    assert resumed.session == sid
    assert (await hub.get_session("t", sid)).state is SessionState.IDLE


async def test_a_resumed_session_after_it_terminated_continues_as_a_new_one(hub: Hub) -> None:
    await _team(hub)
    sid = session_of("claude-code")
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart"))
    await hub.terminate_session("t", "w", sid, "done")
    resumed = await call(
        hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart", source="resume")
    )
    assert resumed.session == f"{sid}.2"
    stop = await call(hub, "t", "w", "claude-code", _stop("claude-code"))
    assert stop.session == f"{sid}.2"
    assert (await hub.get_session("t", sid)).state is SessionState.TERMINATED


async def test_a_clear_whose_session_end_was_lost_leaves_the_old_session_all_the_same(
    hub: Hub, clock: FakeClock
) -> None:
    """``/clear`` moves the Claude Code process to a new session id. When its
    ``SessionEnd`` (reason ``clear``) never reached the hub (the hub was restarting, the
    command hook gave up on it), the old session stayed idle under the same runtime
    process, whose MCP server's beats kept it alive: a message pinned to it (a link's
    crossing, a timer) waited as long as the process ran, shown to no model, never a dead
    letter. The new conversation's ``SessionStart`` (source ``clear``) says the process
    left it: it exits as a ``SessionEnd`` would have made it, and after the exit grace what
    waited for it reaches the new conversation, once."""
    await hub.create_team("t", settings={"anchor_policy": "off", "exit_grace_seconds": 600})
    await hub.add_member("t", "w", "claude-code")
    await hub.add_member("t", "lead")
    key = {"backchannel_runtime": "boot/4242/1000"}  # the one Claude Code process
    old = session_of("claude-code")
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart", **key))
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit", **key))
    await call(hub, "t", "w", "claude-code", _stop("claude-code", **key))
    pinned = await hub.send("t", "lead", "w", "for the old conversation", to_session=old)

    new = "0b7e2f4c-1111-4c2d-9e3f-5a6b7c8d9e0f"
    start = fixture("claude-code", "SessionStart", source="clear", session_id=new, **key)
    assert (await call(hub, "t", "w", "claude-code", start)).session == new
    assert (await hub.get_session("t", old)).state is SessionState.EXITED
    kept, every = await hub.runtime_alive("t", "w", key["backchannel_runtime"])
    assert kept == [new]
    for _ in range(int(600 / every) + 1):  # the process runs on, its MCP server beating
        clock.advance(every)
        await hub.runtime_alive("t", "w", key["backchannel_runtime"])
        await hub.maintain()
    assert (await hub.get_session("t", old)).state is SessionState.TERMINATED
    prompt = fixture("claude-code", "UserPromptSubmit", session_id=new, **key)
    got = await call(hub, "t", "w", "claude-code", prompt)
    assert pinned.message_id in got.delivered
    context = got.answer["hookSpecificOutput"]["additionalContext"]
    assert context.count("for the old conversation") == 1, context


async def test_codex_new_leaves_the_old_session_as_a_clear_does(hub: Hub, clock: FakeClock) -> None:
    """Codex's ``/new`` starts another conversation in the same process with a
    ``SessionStart`` of source ``startup`` and no ``SessionEnd`` for the old one (Codex
    0.171): the old session exits, so what was pinned to it reaches the new conversation
    once its exit grace is over, instead of waiting while the process beats for it."""
    await hub.create_team("t", settings={"anchor_policy": "off", "exit_grace_seconds": 600})
    await hub.add_member("t", "w", "codex")
    await hub.add_member("t", "lead")
    key = {"backchannel_runtime": "boot/4242/1000"}  # the one Codex process
    old = session_of("codex")
    await call(hub, "t", "w", "codex", fixture("codex", "SessionStart", **key))
    await call(hub, "t", "w", "codex", fixture("codex", "UserPromptSubmit", **key))
    await call(hub, "t", "w", "codex", _stop("codex", **key))
    pinned = await hub.send("t", "lead", "w", "for the old conversation", to_session=old)

    new = "01a22324-0dec-7723-8233-0caddb77175b"
    start = fixture("codex", "SessionStart", source="startup", session_id=new, **key)
    assert (await call(hub, "t", "w", "codex", start)).session == new
    assert (await hub.get_session("t", old)).state is SessionState.EXITED
    kept, _ = await hub.runtime_alive("t", "w", key["backchannel_runtime"])
    assert kept == [new]
    clock.advance(601)
    await hub.maintain()
    prompt = fixture("codex", "UserPromptSubmit", session_id=new, **key)
    got = await call(hub, "t", "w", "codex", prompt)
    assert pinned.message_id in got.delivered
    context = got.answer["hookSpecificOutput"]["additionalContext"]
    assert context.count("for the old conversation") == 1, context


@pytest.mark.parametrize(
    ("runtime", "source", "new"),
    [
        ("claude-code", "clear", "0b7e2f4c-1111-4c2d-9e3f-5a6b7c8d9e0f"),
        ("codex", "startup", "01a22324-0dec-7723-8233-0caddb77175b"),
    ],
)
async def test_a_new_conversation_never_shows_both_of_its_process_sessions_live(
    hub: Hub, runtime: str, source: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code's ``/clear`` and Codex's ``/new`` move one process to a new session.
    The new one was opened, and the one left exited, in two transactions: in between,
    every reader (a send's ``"session": "auto"``, the runner, a timer's peer view, the
    dashboard, the process's beats) saw both conversations of the process running and
    could pick the one being left. A reader that looks after every commit sees one."""
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "w", runtime)
    await hub.add_member("t", "lead")
    key = {"backchannel_runtime": "boot/4242/1000"}  # the one CLI process
    old = session_of(runtime)
    await call(hub, "t", "w", runtime, fixture(runtime, "SessionStart", **key))
    await call(hub, "t", "w", runtime, fixture(runtime, PROMPT_EVENT[runtime], **key))
    await call(hub, "t", "w", runtime, _stop(runtime, **key))

    store = hub.store
    transact, seen = store.transact, []

    async def observed(fn: Any) -> Any:
        done = await transact(fn)
        live = await transact(lambda tx: tx.list_sessions("t", "w", which="live"))
        seen.append(sorted(s.session_id for s in live if s.state in RUNNING))
        return done

    monkeypatch.setattr(store, "transact", observed)
    start = fixture(runtime, "SessionStart", source=source, session_id=new, **key)
    assert (await call(hub, "t", "w", runtime, start)).session == new
    monkeypatch.undo()

    assert seen and all(len(running) <= 1 for running in seen), seen
    assert seen[-1] == [new]
    assert (await hub.get_session("t", old)).state is SessionState.EXITED
    assert (await hub.get_session("t", new)).meta["runtime"] == key["backchannel_runtime"]
    # and the session that runs now is the new one, whichever reader asks
    live = await hub.list_sessions("t", "w", which="live")
    assert current_session(live) == await hub.get_session("t", new)


async def test_session_start_recovers_a_crashed_turn_but_not_after_compaction(hub: Hub) -> None:
    await _team(hub)
    sid = session_of("claude-code")
    await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit"))
    start = fixture("claude-code", "SessionStart")
    await call(hub, "t", "w", "claude-code", {**start, "source": "compact"})
    assert (await hub.get_session("t", sid)).state is SessionState.ACTIVE
    await call(hub, "t", "w", "claude-code", {**start, "source": "resume"})
    assert (await hub.get_session("t", sid)).state is SessionState.IDLE


async def test_a_resume_in_a_second_process_leaves_the_turn_the_first_one_runs(hub: Hub) -> None:
    """``claude --resume`` of a conversation whose turn runs in another terminal: that
    process still runs, so its turn is no crashed one. It stays open with its ledger, and
    its closing ``<message>`` repeating its tool send goes out once. Once that process is
    gone, a resume recovers the turn as before."""
    await _team(hub)
    sid = session_of("claude-code")
    first = await asyncio.create_subprocess_exec("sleep", "600")  # the first terminal's CLI
    try:
        [running_key] = runtime_keys(first.pid, 1)
        one = {"backchannel_runtime": running_key}
        two = {"backchannel_runtime": "boot/4343/2000"}
        await call(hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart", **one))
        await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit", **one))
        await hub.send("t", "w", "lead", "the report is ready", sender_session=sid)
        start = fixture("claude-code", "SessionStart", source="resume", **two)
        assert (await call(hub, "t", "w", "claude-code", start)).session == sid
        s = await hub.get_session("t", sid)
        assert (s.state, s.turn) == (SessionState.ACTIVE, 1)
        closing = 'Done.\n<message to="lead">the report is ready</message>'
        await call(
            hub,
            "t",
            "w",
            "claude-code",
            _stop("claude-code", last_assistant_message=closing, **one),
        )
        assert (await _texts(hub, "lead")).count("the report is ready") == 1
        await call(hub, "t", "w", "claude-code", fixture("claude-code", "UserPromptSubmit", **one))
    finally:
        first.kill()
        await first.wait()
    await call(hub, "t", "w", "claude-code", start)  # its process is gone: a crashed turn
    assert (await hub.get_session("t", sid)).state is SessionState.IDLE


async def test_the_hub_never_reads_the_transcript_a_payload_names(hub: Hub, tmp_path: Path) -> None:
    await _team(hub)
    transcript = tmp_path / "t.jsonl"
    transcript.write_text((FIXTURES / "claude-code" / "transcript.jsonl").read_text())
    payload = fixture("claude-code", "Stop-without-last-message", transcript_path=str(transcript))
    result = await call(hub, "t", "w", "claude-code", payload)
    assert result.problem is None
    assert await _texts(hub, "lead") == []  # the closing text was not taken from the file
    events = await _kinds(hub, session_of("claude-code"))
    assert any(k == "agent_stop" and t == "" and d["hook"] == "Stop" for k, t, d in events)


# -- bad input ------------------------------------------------------------------------------------

_SID = session_of("claude-code")
BAD = {
    "not an object": ["Stop"],
    "a string": "Stop",
    "no event name": {"session_id": _SID},
    "no session id (older version)": {"hook_event_name": "Stop", "last_assistant_message": "x"},
    "mistyped session id": {"hook_event_name": "Stop", "session_id": 42},
    "invalid session id": {"hook_event_name": "Stop", "session_id": "../../etc"},
    "unmapped event": {"hook_event_name": "Notification", "session_id": _SID, "message": "hi"},
    "no tool name": {"hook_event_name": "PreToolUse", "session_id": _SID},
    "end of an unknown session": {"hook_event_name": "SessionEnd", "session_id": _SID},
}


@pytest.mark.parametrize("case", list(BAD))
async def test_bad_input_has_no_effect_and_the_hub_says_why(
    hub: Hub, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    await _team(hub)
    with caplog.at_level(logging.WARNING, logger="backchannel.hooks"):
        result = await call(hub, "t", "w", "claude-code", BAD[case])
    assert result.answer == {}
    assert result.problem
    assert any(
        "had no effect" in r.getMessage() and result.problem in r.getMessage()
        for r in caplog.records
    )
    assert await hub.list_sessions("t") == []


async def test_what_a_payload_says_is_logged_on_one_line(
    hub: Hub, caplog: pytest.LogCaptureFixture
) -> None:
    # a member's payload must not write lines of its own into the hub's log
    await _team(hub)
    forged = "x\n2026-01-01 00:00:00,000 ERROR backchannel.serve: forged\x1b[2J"
    with caplog.at_level(logging.WARNING, logger="backchannel.hooks"):
        result = await call(
            hub, "t", "w", "claude-code", {"hook_event_name": "Stop", "session_id": forged}
        )
    assert result.answer == {}
    said = [r.getMessage() for r in caplog.records if "had no effect" in r.getMessage()]
    assert said and all(m.isprintable() for m in said), said


async def test_an_unknown_runtime_and_someone_elses_session_are_refused(hub: Hub) -> None:
    await _team(hub)
    result = await call(hub, "t", "w", "cursor", fixture("claude-code", "Stop"))
    assert (result.answer, "unknown runtime 'cursor'" in (result.problem or "")) == ({}, True)
    await hub.open_session("t", "lead", _SID)
    result = await call(hub, "t", "w", "claude-code", fixture("claude-code", "Stop"))
    assert result.answer == {}
    assert "belongs to 'lead', not 'w'" in (result.problem or "")
