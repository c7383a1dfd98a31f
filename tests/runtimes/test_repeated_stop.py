"""A ``Stop`` reported twice routes once; two turns that end with the same words route
twice. Where the runtime names the turn (Codex's ``turn_id``, its ``notify``'s
``turn-id``, the ``timestamp`` of Gemini's ``AfterAgent`` call, the uuid of Claude
Code's last assistant message that ``backchannel hook`` reads from its transcript) its
id decides; where it does not (Claude Code through a plain HTTP hook), Claude Code's
``prompt_id`` tells turns of two prompts apart, and else the closing text, what the
session was shown, and a short window do, until the session starts again."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from backchannel.core.turns import stop_print
from backchannel.hub import Hub
from backchannel.hub.turns import LAST_STOP
from backchannel.runtimes.channel_tags import SEEN_FIELD, STOP_ID_FIELD
from backchannel.runtimes.receiver import REPEAT_STOP_SECONDS
from backchannel.testing import FakeClock

from .helpers import STOP_EVENT, call, fixture, session_of

CLOSING = 'Done.\n<message to="lead">Done.</message>'


async def _team(hub: Hub, runtime: str) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "w", runtime)
    await hub.add_member("t", "lead")


class Lead:
    """What reached ``lead``: how many ``Done.`` blocks so far (each taken once)."""

    def __init__(self) -> None:
        self.total = 0

    async def got(self, hub: Hub) -> int:
        taken = await hub.receive("t", "lead", limit=100)
        if taken:
            await hub.ack("t", "lead", [g.message.message_id for g in taken])
        self.total += sum(g.message.text == "Done." for g in taken)
        return self.total


def _stop(runtime: str, turn: str) -> dict[str, Any]:
    """The stop of turn ``turn``, ending with :data:`CLOSING`, in the runtime's shape."""
    if runtime == "codex-notify":
        payload = fixture("codex", "notify", **{"last-assistant-message": CLOSING})
        return {**payload, "turn-id": turn}
    if runtime == "gemini":
        stamp = f"2026-11-22T09:00:{int(turn):02d}.000Z"
        return fixture("gemini", "AfterAgent", prompt_response=CLOSING, timestamp=stamp)
    return fixture(runtime, STOP_EVENT[runtime], last_assistant_message=CLOSING, turn_id=turn)


ID_RUNTIMES = ["codex", "codex-notify", "gemini"]


@pytest.mark.parametrize("runtime", ID_RUNTIMES)
async def test_two_turns_with_the_same_closing_text_both_route(
    hub: Hub, clock: FakeClock, runtime: str
) -> None:
    """The second turn ended with byte-identical text within the window and no prompt
    hook between (Codex's notify has none; a prompt hook that failed): it was taken
    for the first one's ``Stop`` again, and its blocks and crossing were lost."""
    lead = Lead()
    rt = "codex" if runtime == "codex-notify" else runtime
    await _team(hub, rt)
    await call(hub, "t", "w", rt, _stop(runtime, "1"))
    assert await lead.got(hub) == 1
    clock.advance(5)
    await call(hub, "t", "w", rt, _stop(runtime, "2"))
    assert await lead.got(hub) == 2


@pytest.mark.parametrize("runtime", ID_RUNTIMES)
async def test_the_same_turns_stop_again_routes_nothing_however_late(
    hub: Hub, clock: FakeClock, runtime: str
) -> None:
    lead = Lead()
    rt = "codex" if runtime == "codex-notify" else runtime
    await _team(hub, rt)
    await call(hub, "t", "w", rt, _stop(runtime, "1"))
    await call(hub, "t", "w", rt, _stop(runtime, "1"))
    clock.advance(REPEAT_STOP_SECONDS * 10)
    assert (await call(hub, "t", "w", rt, _stop(runtime, "1"))).answer == {}
    assert await lead.got(hub) == 1


def _claude_stop(*seen: str, **fields: str) -> dict[str, Any]:
    payload = fixture("claude-code", "Stop", last_assistant_message=CLOSING, **fields)
    return {**payload, SEEN_FIELD: list(seen)} if seen else payload


def _claude_turn(uuid: str, prompt: str = "p1") -> dict[str, Any]:
    """Claude Code's ``Stop`` as ``backchannel hook`` sends it: ``prompt_id`` from Claude
    Code, the uuid of the turn's last assistant message from its transcript."""
    return _claude_stop(prompt_id=prompt, **{STOP_ID_FIELD: uuid})


async def test_two_claude_code_turns_with_the_same_closing_text_both_route(
    hub: Hub, clock: FakeClock
) -> None:
    """A turn of the same prompt (a channel push woke the idle session, or the prompt
    hook failed) ending with the same words within the window: its last assistant
    message is another one, so it is a turn of its own. It used to be taken for the
    first turn's ``Stop`` again, and its crossing was lost."""
    await _team(hub, "claude-code")
    lead = Lead()
    await call(hub, "t", "w", "claude-code", _claude_turn("a-1"))
    clock.advance(2)
    await call(hub, "t", "w", "claude-code", _claude_turn("a-2"))
    assert await lead.got(hub) == 2


async def test_a_claude_code_stop_reported_again_routes_nothing_however_late(
    hub: Hub, clock: FakeClock
) -> None:
    await _team(hub, "claude-code")
    lead = Lead()
    await call(hub, "t", "w", "claude-code", _claude_turn("a-1"))
    clock.advance(REPEAT_STOP_SECONDS * 10)
    assert (await call(hub, "t", "w", "claude-code", _claude_turn("a-1"))).answer == {}
    assert await lead.got(hub) == 1


async def test_claude_code_turns_of_two_prompts_route_without_the_transcript(
    hub: Hub, clock: FakeClock
) -> None:
    """A plain HTTP hook reads no transcript: Claude Code's own ``prompt_id`` still
    tells the turns of two prompts apart; the same prompt's stop again is a repeat."""
    await _team(hub, "claude-code")
    lead = Lead()
    await call(hub, "t", "w", "claude-code", _claude_stop(prompt_id="p1"))
    clock.advance(2)
    await call(hub, "t", "w", "claude-code", _claude_stop(prompt_id="p1"))
    assert await lead.got(hub) == 1
    await call(hub, "t", "w", "claude-code", _claude_stop(prompt_id="p2"))
    assert await lead.got(hub) == 2


async def test_a_session_start_between_two_identical_stops_lets_the_second_route(
    hub: Hub, clock: FakeClock
) -> None:
    """Nothing names the turns (an HTTP hook; Claude Code gives no ``prompt_id`` before
    a process's first prompt, and a channel push wakes it without one): the session
    started again between the two stops, so the second is a new process's turn, not the
    first stop reported again."""
    await _team(hub, "claude-code")
    lead = Lead()
    await call(hub, "t", "w", "claude-code", _claude_stop())
    clock.advance(2)
    await call(
        hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart", source="resume")
    )
    await call(hub, "t", "w", "claude-code", _claude_stop())
    assert await lead.got(hub) == 2


async def test_claude_codes_stop_reported_twice_routes_once(hub: Hub, clock: FakeClock) -> None:
    """No id: the same text on the idle session, shown the same, within the window."""
    await _team(hub, "claude-code")
    lead = Lead()
    await call(hub, "t", "w", "claude-code", _claude_stop("m1"))
    clock.advance(REPEAT_STOP_SECONDS - 1)
    await call(hub, "t", "w", "claude-code", _claude_stop("m1"))
    assert await lead.got(hub) == 1


async def test_a_claude_code_turn_on_a_new_channel_push_routes(hub: Hub, clock: FakeClock) -> None:
    """An idle Claude Code session woken by a channel push (no prompt hook) that ends
    with the same words as its last turn: its transcript shows a push the last one did
    not, so it is a turn of its own."""
    await _team(hub, "claude-code")
    lead = Lead()
    await call(hub, "t", "w", "claude-code", _claude_stop("m1"))
    clock.advance(2)
    await call(hub, "t", "w", "claude-code", _claude_stop("m1", "m2"))
    assert await lead.got(hub) == 2


async def test_a_claude_code_turn_past_the_window_routes(hub: Hub, clock: FakeClock) -> None:
    """A repeat of one ``Stop`` comes within seconds (two hook processes of a session
    take turns on its lock, each done within the hook's deadline); later, the same
    text is another turn's."""
    await _team(hub, "claude-code")
    lead = Lead()
    await call(hub, "t", "w", "claude-code", _claude_stop())
    clock.advance(REPEAT_STOP_SECONDS)
    await call(hub, "t", "w", "claude-code", _claude_stop())
    assert await lead.got(hub) == 2
    assert REPEAT_STOP_SECONDS <= 60


async def test_an_old_hubs_mark_still_tells_a_repeat(hub: Hub, clock: FakeClock) -> None:
    """A session whose last stop an older hub marked (the print alone, as a string)."""
    await _team(hub, "claude-code")
    lead = Lead()
    await call(hub, "t", "w", "claude-code", _claude_stop())
    s = await hub.get_session("t", session_of("claude-code"))
    old = dataclasses.replace(s, meta={**s.meta, LAST_STOP: stop_print(CLOSING)})
    await hub.store.transact(lambda tx: tx.put_session(old))
    await call(hub, "t", "w", "claude-code", _claude_stop())
    assert await lead.got(hub) == 1
