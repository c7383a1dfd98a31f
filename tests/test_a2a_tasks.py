"""How a member's transcript becomes an A2A task's answer."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("a2a.types")

from a2a.types.a2a_pb2 import TaskState

from backchannel.hub import Hub
from backchannel.interfaces.a2a_tasks import Caller, answer_in, read_progress


def _ev(kind: str, turn: int, text: str = "", **data: Any) -> dict[str, Any]:
    return {"kind": kind, "turn": turn, "text": text, "data": data}


def test_the_answer_is_the_first_real_stop_after_the_input() -> None:
    events = [
        _ev("turn_start", 1),
        _ev("agent_stop", 1, "an older answer"),
        _ev("turn_start", 2, checkpoint=True),
        _ev("agent_stop", 2, "checkpoint reply"),
        _ev("turn_start", 3),
        _ev("agent_stop", 3, "the answer"),
    ]
    got = answer_in(events, 1, "idle")
    assert got is not None
    assert (got.state, got.text, got.artifacts) == (
        TaskState.TASK_STATE_COMPLETED,
        "the answer",
        None,
    )
    assert answer_in(events[:4], 1, "idle") is None  # still at work
    ended = answer_in(events[:4], 1, "terminated")
    assert ended is not None
    assert ended.state == TaskState.TASK_STATE_FAILED


def test_the_member_says_more_in_the_stop_data() -> None:
    asks = answer_in(
        [_ev("agent_stop", 1, "Which city?", a2a={"state": "input-required"})], 0, "idle"
    )
    assert asks is not None
    assert asks.state == TaskState.TASK_STATE_INPUT_REQUIRED
    odd = answer_in([_ev("agent_stop", 1, "x", a2a={"state": "done-ish"})], 0, "idle")
    assert odd is not None
    assert odd.state == TaskState.TASK_STATE_FAILED
    assert "unknown A2A state 'done-ish'" in odd.text
    bad = answer_in([_ev("agent_stop", 1, "x", a2a={"artifacts": "nope"})], 0, "idle")
    assert bad is not None
    assert bad.state == TaskState.TASK_STATE_FAILED
    parts = [{"data": {"k": 1}}]
    rich = answer_in([_ev("agent_stop", 1, "", a2a={"artifacts": [{"parts": parts}]})], 0, "idle")
    assert rich is not None
    assert rich.artifacts == ({"parts": parts},)


async def test_a_long_turn_and_a_long_answer_are_read_whole(hub: Hub) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "w")
    await hub.open_session("t", "w", "a2a-task1")
    await hub.report_event("t", "w", "a2a-task1", "turn_start", "go")
    for i in range(600):
        await hub.report_event("t", "w", "a2a-task1", "thought", f"step {i} " + "x" * 100)
    long_answer = "y" * 50_000
    await hub.report_event("t", "w", "a2a-task1", "agent_stop", long_answer)
    answer, progressed = await read_progress(hub, Caller("t", "w", "user"), "task1", 0)
    assert progressed
    assert answer is not None
    assert answer.text == long_answer
