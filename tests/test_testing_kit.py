"""What ``backchannel.testing`` gives users for their own tests works as promised."""

from __future__ import annotations

import pytest

from backchannel.runner.models import ChatMessage, ModelReply
from backchannel.testing import (
    ScriptContext,
    ScriptedModel,
    call,
    eventually,
    eventually_blocking,
    say,
    use,
)


async def test_eventually_returns_the_first_truthy_value_of_a_sync_or_async_check() -> None:
    calls = []

    def sync_check() -> list[int]:
        calls.append(1)
        return calls if len(calls) >= 3 else []

    assert await eventually(sync_check, what="three calls") == [1, 1, 1]

    async def async_check() -> str:
        return "ready"

    assert await eventually(async_check, what="ready") == "ready"


async def test_eventually_names_what_it_waited_for_and_what_it_last_saw() -> None:
    with pytest.raises(AssertionError) as caught:
        await eventually(lambda: 0, what="m1 acked", within=0.05)
    message = str(caught.value)
    assert "waiting for m1 acked" in message
    assert "last returned 0" in message


async def test_eventually_shows_what_it_is_told_to_once_it_times_out() -> None:
    shown: list[int] = []

    def workers() -> str:
        shown.append(1)
        return "worker a: retrying"

    assert await eventually(lambda: "x", what="x", show=workers) == "x"
    assert shown == []  # not called unless it times out
    with pytest.raises(AssertionError, match=r"last returned None; then: 'worker a: retrying'"):
        await eventually(lambda: None, what="a held worker", within=0.05, show=workers)
    with pytest.raises(AssertionError, match=r"then: 'worker a: retrying'"):
        eventually_blocking(lambda: None, what="a held worker", within=0.05, show=workers)
    assert shown == [1, 1]


def test_eventually_blocking_is_the_same_loop_without_an_event_loop() -> None:
    seen = iter([None, "", "done"])
    assert eventually_blocking(lambda: next(seen), what="done") == "done"
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for x; .* \[\]"):
        eventually_blocking(list, what="x", within=0.05)


async def test_the_scripted_model_plays_a_policy_offline() -> None:
    def policy(ctx: ScriptContext) -> ModelReply:
        if ctx.step == 0:
            return use(call("send_message", to="lead", text=f"got: {ctx.text}"))
        return say(f"done after {ctx.result()!r} in turn {ctx.turn}")

    model = ScriptedModel("worker", policy)
    first = await model.complete("", [ChatMessage("user", "count the TODOs")], [])
    [tool_call] = first.tool_calls
    assert (tool_call.name, tool_call.arguments) == (
        "send_message",
        {"to": "lead", "text": "got: count the TODOs"},
    )
    assert first.usage.input_tokens > 0
    history = [
        ChatMessage("user", "count the TODOs"),
        ChatMessage("assistant", "", first.tool_calls),
        ChatMessage("tool", "sent", call_id=tool_call.call_id),
    ]
    second = await model.complete("", history, [])
    assert second.text == "done after 'sent' in turn 1"
    assert second.tool_calls == ()
