"""What a callee's answer is, how the task reads to the callee, and how long delegation
records live."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core import delegation as rules
from backchannel.errors import InvalidRequest, Unauthorized
from backchannel.hub import Hub
from backchannel.runtimes.common import format_message
from backchannel.testing import FakeClock, MemoryStore, eventually
from backchannel.types import DelegationState, MessageKind
from tests.runtimes.helpers import STOP_EVENT, call, fixture, session_of
from tests.test_delegation import (
    FAST,
    SECRET,
    Scripted,
    _answer,
    _callee_hub,
    _results,
    _task_taken,
    _team,
    scripted,
)

__all__ = ["scripted"]  # the fixture, shared with test_delegation


async def _delegate_and_answer(hub: Hub, closing: str, tool_use_id: str = "tu_1") -> Any:
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    await hub.delegate("t", "lead", "lead-s", "counter", "count files", tool_use_id=tool_use_id)
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
    await _answer(hub, "counter", closing)
    got = await hub.receive("t", "lead", session="lead-s", limit=20)
    if got:
        await hub.ack("t", "lead", [g.message.message_id for g in got])
    return got


# -- the answer is the closing text as the caller should see it ---------------------------


async def test_an_answer_given_only_in_blocks_to_the_caller_is_the_tool_result(hub: Hub) -> None:
    await _team(hub)
    got = await _delegate_and_answer(
        hub, '<message to="lead">12 files</message>\n<message to="lead">3 of them tests</message>'
    )
    assert [(g.message.kind, g.message.text) for g in got] == [
        (
            MessageKind.TOOL_RESULT,
            "Result of delegate(to='counter') [tu_1]:\n12 files\n\n3 of them tests",
        )
    ], "the blocks are the answer, and are not delivered a second time as messages"
    [d] = await hub.list_delegations("t")
    assert (d.state, d.result) == (DelegationState.ANSWERED, "12 files\n\n3 of them tests")


async def test_blocks_to_others_are_still_sent_when_the_caller_gets_its_answer(hub: Hub) -> None:
    await _team(hub)
    got = await _delegate_and_answer(
        hub, '<message to="lister">FYI: 12 files</message><message to="lead">12</message>'
    )
    assert [g.message.text for g in got] == ["Result of delegate(to='counter') [tu_1]:\n12"]
    fyi = await hub.receive("t", "lister", limit=10)
    assert [(g.message.kind, g.message.text) for g in fyi] == [
        (MessageKind.DIRECT, "FYI: 12 files")
    ]


async def test_text_outside_blocks_is_the_answer_and_blocks_stay_messages(hub: Hub) -> None:
    await _team(hub)
    got = await _delegate_and_answer(hub, 'There are 12.\n<message to="lead">ping</message>')
    assert sorted((g.message.kind.value, g.message.text) for g in got) == [
        ("direct", "ping"),
        ("tool_result", "Result of delegate(to='counter') [tu_1]:\nThere are 12."),
    ]


@pytest.mark.parametrize("closing", ["", "   \n", '<message to="lead">  </message>'])
async def test_an_empty_answer_is_reported_as_empty(hub: Hub, closing: str) -> None:
    await _team(hub)
    got = await _delegate_and_answer(hub, closing)
    [result] = [g.message for g in got if g.message.kind is MessageKind.TOOL_RESULT]
    assert result.text == (
        "Result of delegate(to='counter') [tu_1]:\n(the agent answered with no text)"
    )
    [r] = result.meta["results"]
    assert (r["result"], r["empty"]) == ("", True)


async def test_an_inbound_task_answered_in_blocks_sends_the_blocks_as_the_answer(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda path, body, n: (200, 0))
    hub = await _callee_hub({"caller": srv.url})
    try:
        d = await _task_taken(hub, "tu_b", task="count", reply_token="tok")
        assert d.callee_session is not None
        await hub.report_event(
            "t", "worker", d.callee_session, "agent_stop", '<message to="hub-a">7</message>'
        )
        await eventually(lambda: len(srv.requests) == 1, what="one POST")
        assert srv.requests[0][1]["result"] == "7"
        assert await hub.receive("t", "hub-a", limit=10) == [], "no second copy as a message"
    finally:
        await hub.close()


# -- the callee hub and a 409 --------------------------------------------------------------


async def test_a_409_for_an_answer_is_not_reported_as_lost(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda path, body, n: (409, 0))
    hub = await _callee_hub({"caller": srv.url})
    try:
        d = await _task_taken(hub, "tu_c", task="count", reply_token="tok")
        assert d.callee_session is not None
        await hub.report_event("t", "worker", d.callee_session, "agent_stop", "7")

        async def noted() -> list[str]:
            got = await hub.receive("t", "worker", limit=10)
            return [g.message.text for g in got if g.message.kind is MessageKind.SYSTEM]

        [note] = await eventually(noted, what="a system note to the worker")
        assert "already had a different answer" in note
        assert "could not be delivered" not in note
        assert len(srv.requests) == 1, "a 409 is final: no retry"
        after = await hub.get_delegation("t", d.delegation_id)
        assert after.state is DelegationState.ANSWERED
        assert "HTTP 409" in (after.error or "")
    finally:
        await hub.close()


# -- the task reads as an ordinary request --------------------------------------------------


def test_a_delegated_task_is_framed_like_any_message_from_the_teammate() -> None:
    assert format_message("lead", "delegation", "count the files") == (
        format_message("lead", "direct", "count the files")
    )


@pytest.mark.parametrize("runtime", ["claude-code", "codex", "gemini"])
async def test_a_hook_attached_callee_reads_an_ordinary_request_and_answers_each_one(
    hub: Hub, clock: FakeClock, runtime: str
) -> None:
    await _team(hub)
    await hub.add_member("t", "agent", runtime)
    sid = session_of(runtime)
    stop, text_field = STOP_EVENT[runtime], "prompt_response" if runtime == "gemini" else None
    text_field = text_field or "last_assistant_message"

    stops = 0

    async def stop_hook(text: str) -> dict[str, Any]:
        nonlocal stops
        stops += 1  # each stop is another turn's end, named as the runtime names it
        named = {
            "codex": {"turn_id": f"turn-{stops}"},
            "gemini": {"timestamp": f"2026-11-22T09:00:{stops:02d}.000Z"},
        }.get(runtime, {})
        fields = {text_field: text, "stop_hook_active": False, **named}
        payload = fixture(runtime, stop, **fields)
        return (await call(hub, "t", "agent", runtime, payload)).answer

    results = []
    for n, task in enumerate(["review the diff", "and the tests"], 1):
        clock.advance(10)
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate("t", "lead", "lead-s", "agent", task, tool_use_id=f"tu_{n}")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        handed = await stop_hook("idle")  # the agent's turn ends: the task is handed over
        assert handed["reason"].endswith(f"[From lead] {task}")
        assert "delegat" not in handed["reason"]
        await stop_hook(f'<message to="lead">answer {n}</message>')
        results += [m.text for m in await _results(hub)]
    assert results == [
        "Result of delegate(to='agent') [tu_1]:\nanswer 1",
        "Result of delegate(to='agent') [tu_2]:\nanswer 2",
    ]
    assert [d.callee_session for d in await hub.list_delegations("t")] == [sid, sid]


# -- late answers after a failure ------------------------------------------------------------


async def test_an_answer_after_a_refused_task_arrives_as_a_late_result(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda path, body, n: (404, 0))
    cfg = CallbackConfig(secret=SECRET, services={"hub-b": Service("hub-b", srv.url)}, retry=FAST)
    async with Hub(MemoryStore(), callbacks=cfg) as hub:
        await _team(hub)
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate("t", "lead", "lead-s", "w@hub-b", "task", tool_use_id="tu_f")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        await eventually(lambda: len(srv.requests) == 1, what="one POST")
        token = srv.requests[0][1]["reply"]["bearerToken"]
        failed = await eventually(lambda: _results(hub), what="the failed result")
        assert failed[0].meta["results"][0]["reason"] == "failed"
        # the callee's hub did the task all the same, and answers
        late = await hub.accept_tool_response(token, "done after all")
        assert late.state is DelegationState.LATE
        [msg] = await _results(hub)
        assert msg.text == (
            "Late result of delegate(to='w@hub-b') [tu_f], which had failed:\ndone after all"
        )
        assert d.delegation_id == late.delegation_id


# -- retention -------------------------------------------------------------------------------


async def test_finished_delegations_and_spent_tokens_are_pruned_after_retention(
    clock: FakeClock,
) -> None:
    cfg = CallbackConfig(
        secret=SECRET,
        services={"hub-b": Service("hub-b", "http://127.0.0.1:9")},
        retry=FAST,
        retention=100.0,
    )
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await _team(hub)
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate("t", "lead", "lead-s", "counter", "n?", timeout_s=60, tool_use_id="l")
        await hub.delegate("t", "lead", "lead-s", "w@hub-b", "m?", timeout_s=60, tool_use_id="r")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        [job] = await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox"))
        token = job.payload["body"]["reply"]["bearerToken"]
        await _answer(hub, "counter", "12")
        await hub.accept_tool_response(token, "7")
        assert len(await _results(hub)) == 1

        async def kept() -> list[str]:
            await hub.maintain()
            return sorted(d.tool_use_id for d in await hub.list_delegations("t"))

        claims = rules.verify_token(SECRET, token, now=clock.now())

        async def remembered() -> bool:
            """Whether the hub still holds the token's id as spent (asking re-spends it)."""
            fresh = await hub.store.transact(
                lambda tx: tx.spend_token(claims["jti"], float(claims["exp"]))
            )
            return not fresh

        clock.advance(99)
        assert await kept() == ["l", "r"], "within the retention period"
        # past the retention period, but the reply token is still good: a repeated
        # callback must still find its delegation (and be acknowledged)
        clock.advance(60 + rules.TOKEN_GRACE - 99 - 1)
        assert await kept() == ["l", "r"]
        assert (await hub.accept_tool_response(token, "7")).result == "7"
        assert await remembered()
        clock.advance(100)  # the token has expired, and the pruning job came round again
        assert await kept() == []
        assert not await remembered(), "spent token ids go once past their expiry"
        with pytest.raises(Unauthorized, match="expired"):
            await hub.accept_tool_response(token, "7")
        # nothing left: the pruning job ends, and the next delegation starts it again
        assert await hub.store.read(lambda tx: tx.list_jobs("t", kind=rules.PRUNE_JOB)) == []
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate("t", "lead", "lead-s", "counter", "again", tool_use_id="l2")
        [prune] = await hub.store.read(lambda tx: tx.list_jobs("t", kind=rules.PRUNE_JOB))
        assert prune.due_at == clock.now() + 100


def test_the_retention_period_is_configurable() -> None:
    assert CallbackConfig.load(None, env={}).retention == 7 * 86_400
    env = {"BACKCHANNEL_DELEGATION_RETENTION": "3600"}
    assert CallbackConfig.load(None, env=env).retention == 3600
    with pytest.raises(InvalidRequest, match="BACKCHANNEL_DELEGATION_RETENTION"):
        CallbackConfig.load(None, env={"BACKCHANNEL_DELEGATION_RETENTION": "a week"})


# -- total_tools: the number of delegations the caller's turn issued ------------------------


async def test_the_reply_token_counts_the_delegations_of_the_turn(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda path, body, n: (202, 0))
    cfg = CallbackConfig(secret=SECRET, services={"hub-b": Service("hub-b", srv.url)}, retry=FAST)
    async with Hub(MemoryStore(), callbacks=cfg) as hub:
        await _team(hub)

        async def sent(n: int) -> list[dict[str, Any]]:
            await eventually(lambda: len(srv.requests) == n, what=f"{n} POSTs")
            return [
                rules.verify_token(SECRET, body["reply"]["bearerToken"], now=hub.clock.now())
                for _, body, _ in srv.requests
            ]

        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate("t", "lead", "lead-s", "counter", "local", tool_use_id="a1")
        await hub.delegate("t", "lead", "lead-s", "w@hub-b", "remote 1", tool_use_id="a2")
        await hub.delegate("t", "lead", "lead-s", "w@hub-b", "remote 2", tool_use_id="a3")
        # the count is known when the turn ends: until then the tasks wait in the hub
        assert await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox")) == []
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        claims = await sent(2)
        assert sorted((c["tool_use_id"], c["total_tools"]) for c in claims) == [
            ("a2", 3),
            ("a3", 3),
        ]
        assert len({c["jti"] for c in claims}) == 2
        # a turn that issued one delegation says so
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate("t", "lead", "lead-s", "w@hub-b", "remote 3", tool_use_id="b1")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        assert [(c["tool_use_id"], c["total_tools"]) for c in (await sent(3))[2:]] == [("b1", 1)]


@pytest.mark.parametrize("end", ["retried", "recovered", "terminated"])
async def test_a_turn_that_ends_without_agent_stop_still_sends_its_tasks(
    scripted: Callable[..., Scripted], end: str
) -> None:
    srv = scripted(lambda path, body, n: (202, 0))
    cfg = CallbackConfig(secret=SECRET, services={"hub-b": Service("hub-b", srv.url)}, retry=FAST)
    async with Hub(MemoryStore(), callbacks=cfg) as hub:
        await _team(hub)
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate("t", "lead", "lead-s", "w@hub-b", "one", tool_use_id="c1")
        await hub.delegate("t", "lead", "lead-s", "w@hub-b", "two", tool_use_id="c2")
        if end == "retried":
            await hub.report_event("t", "lead", "lead-s", "turn_start")
        elif end == "recovered":
            await hub.open_session("t", "lead", "lead-s")
        else:
            await hub.terminate_session("t", "lead", "lead-s")
        await eventually(lambda: len(srv.requests) == 2, what="two POSTs")
        totals = [
            rules.verify_token(SECRET, body["reply"]["bearerToken"], now=hub.clock.now())[
                "total_tools"
            ]
            for _, body, _ in srv.requests
        ]
        assert totals == [2, 2]


async def test_results_that_came_in_during_a_retried_turn_are_still_delivered(hub: Hub) -> None:
    await _team(hub)
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    await hub.delegate("t", "lead", "lead-s", "counter", "count", tool_use_id="tu_r")
    await _answer(hub, "counter", "9")  # in while the turn runs: it waits for the turn's end
    await hub.report_event("t", "lead", "lead-s", "turn_start")  # the runtime retried the turn
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
    assert [m.text for m in await _results(hub)] == ["Result of delegate(to='counter') [tu_r]:\n9"]
