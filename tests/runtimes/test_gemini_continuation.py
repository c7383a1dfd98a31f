"""Gemini CLI's continuations: an AfterAgent ``deny`` makes Gemini fire BeforeAgent
again for that input and then report the whole continuation's text (the text before it
first). One continuation is one hub turn, and only its own text is routed; the context
Gemini shows the model survives its HTML escaping."""

from __future__ import annotations

from typing import Any

from backchannel.hub import Hub

from .helpers import call, fixture, session_of

SID = session_of("gemini")


async def _team(hub: Hub) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "w", "gemini")
    await hub.add_member("t", "lead")


async def _texts(hub: Hub, member: str) -> list[str]:
    got = await hub.receive("t", member, limit=100)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return [g.message.text for g in got]


async def _events(hub: Hub, kind: str) -> list[dict[str, Any]]:
    data = await hub.get_session_data("t", SID)
    return [e for e in data["events"] if e["kind"] == kind]


async def test_a_continuation_is_one_turn_and_routes_only_its_own_text(hub: Hub) -> None:
    await _team(hub)
    start = await call(hub, "t", "w", "gemini", fixture("gemini", "SessionStart"))
    context = start.answer["hookSpecificOutput"]["additionalContext"]
    assert "<" not in context and ">" not in context  # Gemini would show &lt; &gt;
    await call(hub, "t", "w", "gemini", fixture("gemini", "BeforeAgent", prompt="Draft it."))
    await hub.send("t", "lead", "w", "also list the fixes")

    first = 'Drafted.\n<message to="lead">draft ready</message>'
    stop = await call(
        hub, "t", "w", "gemini", fixture("gemini", "AfterAgent", prompt_response=first)
    )
    reason = stop.answer["reason"]
    assert stop.answer["decision"] == "deny" and "[From lead] also list the fixes" in reason

    again = await call(hub, "t", "w", "gemini", fixture("gemini", "BeforeAgent", prompt=reason))
    assert again.answer == {} and again.problem is None
    assert len(await _events(hub, "turn_start")) == 2  # the prompt's turn, the continuation

    whole = first + "\n\nFixes: #12, #13."
    end = await call(
        hub, "t", "w", "gemini",
        fixture("gemini", "AfterAgent", prompt_response=whole, stop_hook_active=True),
    )  # fmt: skip
    assert end.answer == {}
    stops = await _events(hub, "agent_stop")
    assert [e["text"] for e in stops] == [first, "Fixes: #12, #13."]
    assert await _texts(hub, "lead") == ["draft ready"]  # sent once, not twice
    s = await hub.get_session("t", SID)
    assert s.state.value == "idle" and s.turn == 2

    # the next prompt opens a turn of its own again
    await call(hub, "t", "w", "gemini", fixture("gemini", "BeforeAgent", prompt="Next."))
    assert len(await _events(hub, "turn_start")) == 3
