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


async def test_a_task_brought_up_to_date_after_another_hub_saved_its_answer_shows_it_once(
    hub: Hub,
) -> None:
    """Two hubs on one store: the one whose executor waits for the member saves the
    answer's artifact update before the task's end. A read of the task on the other hub
    in between (a send of the same message there, which answers with this task) found it
    not ended and not live there, brought it up to date from the member's transcript and
    appended the answer's artifact a second time: the caller's task showed the answer
    twice. The answer's artifacts now take the place of those saved, each once."""
    from a2a.server.context import ServerCallContext
    from a2a.types.a2a_pb2 import Artifact, Part, Task

    from backchannel.interfaces.a2a_tasks import STATE_KEY, HubTaskStore

    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "w")
    await hub.open_session("t", "w", "a2a-task2")
    await hub.report_event("t", "w", "a2a-task2", "turn_start", "go")
    await hub.report_event("t", "w", "a2a-task2", "agent_stop", "the answer")
    context = ServerCallContext(state={STATE_KEY: Caller("t", "w", "user")})
    saved_there = Task(id="task2", context_id="ctx2")
    saved_there.status.state = TaskState.TASK_STATE_WORKING
    saved_there.artifacts.append(
        Artifact(artifact_id="task2-a0", name="answer", parts=[Part(text="the answer")])
    )
    await HubTaskStore(hub).save(saved_there, context)  # the other hub's executor

    here = await HubTaskStore(hub).get("task2", context)
    assert here is not None
    assert here.status.state == TaskState.TASK_STATE_COMPLETED
    assert [(a.artifact_id, [p.text for p in a.parts]) for a in here.artifacts] == [
        ("task2-a0", ["the answer"])
    ]
