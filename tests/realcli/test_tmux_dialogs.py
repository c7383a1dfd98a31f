"""A message typed in by the hub's tmux adapter while the real Claude Code, Codex or
Gemini CLI shows a dialog of its own (a tool's permission or approval question, chosen
with Enter) in a real tmux pane: the adapter types nothing into it, so the tool the
model asked to run is not approved by the message's keys; the message is held (not
acked) while the dialog shows and reaches the model once, as a prompt of its own, after
the user has answered the dialog."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from backchannel.core.framing import frame
from backchannel.testing import eventually
from tests.conftest import Server
from tests.delivery.conftest_adapters import dispatching, running_hub, wait_state

from .fake_anthropic import Reply, Request, Rule, call
from .harness import Rig, attached
from .test_interactive import _enter_again
from .test_tmux_paste import CLI_OWN_SERVICES, _prompt, _typed_as, _warm_pane
from .tmux_harness import wait_until

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(600)]

#: What each CLI's dialog asking to run a shell command shows.
DIALOG = {
    "claude-code": "Do you want to proceed?",
    "codex": "Would you like to run the following command?",
    "gemini": "Allow execution",
}


#: What Claude Code puts before the next prompt once its user said no to a tool.
CLAUDE_DENIED = "[Request interrupted by user for tool use]"


@pytest.fixture(params=["claude-code", "codex", "gemini"])
def rig(
    request: pytest.FixtureRequest, server: Server, bin_dir: Path, tmp_path: Path
) -> Iterator[Rig]:
    with attached(request.param, server, bin_dir, tmp_path) as r:
        yield r
        assert set(r.proxy.seen) <= CLI_OWN_SERVICES[r.runtime], r.proxy.seen
        r.proxy.seen.clear()


def _run_shell(rig: Rig, command: str) -> Any:
    """The model's reply asking the CLI to run ``command`` in its shell tool (which the
    CLI, in its default approval mode, asks its user about first)."""

    def reply(req: Request) -> Reply:
        tools = rig.model.tools(req)
        if rig.runtime == "claude-code":
            return call("Bash", command=command, description="Touch a file")
        if rig.runtime == "gemini":
            return call("run_shell_command", command=command, description="Touch a file")
        # Codex: its shell tool, the command run outside the sandbox (asked first)
        escalate = {"sandbox_permissions": "require_escalated", "justification": "touch it"}
        if "shell_command" in tools:
            return call("shell_command", command=command, **escalate)
        if "exec_command" in tools:
            return call("exec_command", cmd=command, **escalate)
        return call("shell", command=["bash", "-lc", command], **escalate)

    return reply


def _asked_once(rig: Rig, mark: str, text: str, screen: str) -> list[str]:
    """The model was asked with ``text``, framed as bob's message, in exactly one
    prompt: the only one of the CLI's turns that holds ``mark``. On failure, every
    request the model got (the CLI's own ones without tools too) and the pane. Returns
    the prompts of the CLI's turns."""
    assert rig.api is not None
    requests = list(rig.api.requests)
    asked = [_prompt(rig, q) for q in requests if rig.model.tools(q)]
    seen = [(bool(rig.model.tools(q)), _prompt(rig, q)[-300:]) for q in requests]
    want = [_typed_as(rig, frame("[From bob]", text))]
    assert [p for p in asked if mark in p] == want, (seen, screen)
    return asked


async def test_a_message_typed_while_the_cli_asks_to_run_a_tool_approves_nothing(
    rig: Rig, tmp_path: Path
) -> None:
    side = tmp_path / "approved-by-a-message"
    model = rig.model
    rules = [
        Rule(
            lambda q: bool(model.tools(q)) and "RUN-THE-TOOL" in _prompt(rig, q),
            _run_shell(rig, f"touch {side}"),
            1,
        )
    ]
    if rig.runtime == "claude-code":  # the mode that asks before each shell command
        settings = rig.home / ".claude" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({"permissions": {"defaultMode": "default"}}))
    with _warm_pane(rig, rules) as (pane, setting):
        pane.type("RUN-THE-TOOL please.")
        wait_until(
            lambda: DIALOG[rig.runtime] in pane.screen() or _enter_again(pane, "RUN-THE-TOOL"),
            60,
            "the dialog asking to run the tool",
            pane,
        )
        mark = "WHILE-THE-DIALOG-SHOWS"
        text = f"{mark} please note this."
        async with running_hub() as hub:
            await hub.add_member("t", "alice", rig.runtime, delivery=setting)
            await hub.add_member("t", "bob", "llm")
            async with dispatching(hub) as d:
                sent = await hub.send("t", "bob", "alice", text, link=False)

                def held_or_acked() -> bool:
                    return any(w.state == "held" for w in d.status())

                async def settled() -> str | None:
                    st = await hub.message_status("t", sent.message_id)
                    if st.state.value == "acked":
                        return "acked"
                    return "held" if held_or_acked() else None

                got = await eventually(settled, within=60, what="the message held or acked")
                screen = pane.screen()
                assert got == "held", f"typed into the dialog\n--- screen ---\n{screen}"
                assert not side.exists(), "the message's keys approved the tool"
                assert DIALOG[rig.runtime] in screen, screen
                # the user says no (Esc), and the CLI is back at its prompt: the message
                # is typed in then, once
                pane.pane.send_keys("Escape", enter=False)
                await wait_state(hub, "t", sent.message_id, "acked", within=90)

                def asked() -> list[str]:
                    assert rig.api is not None
                    got = [_prompt(rig, q) for q in list(rig.api.requests) if model.tools(q)]
                    return [p for p in got if mark in p]

                wait_until(
                    lambda: "Noted." in pane.screen().rpartition(mark)[2],
                    90,
                    "the answer to the message",
                    pane,
                )
    assert not side.exists(), "the tool ran: approved by the message's keys"
    want = _typed_as(rig, frame("[From bob]", text))
    # Claude Code puts the note that its user said no in the prompt after it
    got = [p.removeprefix(f"{CLAUDE_DENIED}\n\n") for p in asked()]
    assert got == [want], (asked(), want)


#: A picker of the CLI's own, opened by its user's slash command, that takes Enter as
#: a choice (Gemini CLI's session browser resumes the chosen session, its ``x`` deletes
#: one), what it shows, and what shows once it is drawn whole. (Claude Code's /resume,
#: /mcp, /config and /permissions panels: tests/delivery/test_tmux.py, by their screens.)
PICKER = {"gemini": ("/resume", "Chat Sessions", "Resume: Enter")}
#: seconds between two presses of Escape while a dialog still shows (a user's pace)
ESCAPE_AGAIN = 3.0


@pytest.fixture(params=sorted(PICKER))
def picker_rig(
    request: pytest.FixtureRequest, server: Server, bin_dir: Path, tmp_path: Path
) -> Iterator[Rig]:
    with attached(request.param, server, bin_dir, tmp_path) as r:
        yield r
        assert set(r.proxy.seen) <= CLI_OWN_SERVICES[r.runtime], r.proxy.seen


async def test_a_message_typed_while_the_cli_shows_a_picker_waits_for_it_to_close(
    picker_rig: Rig,
) -> None:
    """The user opened a picker of the CLI's own: the message is held, not typed into
    it (its Enter would choose for the user, and the text would not reach the model),
    and reaches the model once, as a prompt of its own, once the user closed it."""
    rig = picker_rig
    command, shows, drawn = PICKER[rig.runtime]
    with _warm_pane(rig) as (pane, setting):
        pane.type(command)
        wait_until(
            lambda: shows in pane.screen() or _enter_again(pane, command),
            60,
            f"the picker {command} opens",
            pane,
        )
        pane.wait_for(drawn)  # drawn whole (Claude Code draws its footer last)
        mark = "WHILE-THE-PICKER-SHOWS"
        text = f"{mark} please note this."
        async with running_hub() as hub:
            await hub.add_member("t", "alice", rig.runtime, delivery=setting)
            await hub.add_member("t", "bob", "llm")
            async with dispatching(hub) as d:
                sent = await hub.send("t", "bob", "alice", text, link=False)

                async def settled() -> str | None:
                    st = await hub.message_status("t", sent.message_id)
                    if st.state.value == "acked":
                        return "acked"
                    return "held" if any(w.state == "held" for w in d.status()) else None

                got = await eventually(settled, within=60, what="the message held or acked")
                screen = pane.screen()
                assert got == "held", f"typed into the picker\n--- screen ---\n{screen}"
                assert mark not in screen and shows in screen, screen

                # the user closes it with Escape, once, and again only if it still shows
                # seconds later: two close together are Gemini CLI's rewind, which opens
                # a dialog of its own ("Esc to close"), closed the same way
                pressed = [-1e9]

                def closed() -> bool:
                    screen = pane.screen()
                    if shows not in screen and "esc to close" not in screen.lower():
                        return True
                    if time.monotonic() - pressed[0] >= ESCAPE_AGAIN:
                        pane.pane.send_keys("Escape", enter=False)
                        pressed[0] = time.monotonic()
                    return False

                wait_until(closed, 30, "the picker closed", pane)
                await wait_state(hub, "t", sent.message_id, "acked", within=90)
                wait_until(
                    lambda: "Noted." in pane.screen().rpartition(mark)[2],
                    90,
                    "the answer to the message",
                    pane,
                )
                screen = pane.screen()
    _asked_once(rig, mark, text, screen)


#: What each CLI lists once its user typed ``/`` into its prompt (Gemini CLI under the
#: input line, Claude Code and Codex above it).
COMMANDS = {
    "gemini": "Clear the screen",
    "claude-code": "Add a working directory",
    "codex": "choose what model",
}


@pytest.fixture(params=sorted(COMMANDS))
def typing_rig(
    request: pytest.FixtureRequest, server: Server, bin_dir: Path, tmp_path: Path
) -> Iterator[Rig]:
    with attached(request.param, server, bin_dir, tmp_path) as r:
        yield r
        assert set(r.proxy.seen) <= CLI_OWN_SERVICES[r.runtime], r.proxy.seen
        r.proxy.seen.clear()


async def _held_while_the_user_types(
    rig: Rig,
    typed: str,
    shows: str,
    mark: str,
    undo: str,
    reason: str | None = None,
    keys: Sequence[str] = (),
) -> list[str]:
    """Type ``typed`` into the CLI's prompt (not sent) and wait for ``shows`` (then
    press ``keys`` and wait for them to move the cursor); send a
    message marked ``mark``: it must be held (its worker's error naming ``reason``),
    nothing of it on screen and ``shows`` still there. Then press ``undo`` until
    ``shows`` is gone, as the user would: the message must be acked and answered. The
    prompts the model was asked, for the caller's checks; the message's must be its
    own prompt, once."""
    text = f"{mark} please note this."
    with _warm_pane(rig) as (pane, setting):
        pane.pane.send_keys(typed, enter=False, literal=True)
        pane.wait_for(shows)
        if keys:  # pressed, and seen to have moved the cursor before the message comes

            def cursor() -> str:
                return "".join(pane.pane.cmd("display-message", "-p", "#{cursor_x}").stdout)

            before = cursor()
            pressed = [time.monotonic() - 3.0]

            def moved() -> bool:
                # a key taken while the CLI redrew its prompt can be lost: pressed
                # again after 3 s unmoved (the keys used move to the draft's start,
                # where pressing them again changes nothing)
                if cursor() != before:
                    return True
                if time.monotonic() - pressed[0] >= 3.0:
                    for key in keys:
                        pane.pane.send_keys(key, enter=False)
                    pressed[0] = time.monotonic()
                return False

            wait_until(moved, 30, f"{keys} to move the cursor", pane)
        async with running_hub() as hub:
            await hub.add_member("t", "alice", rig.runtime, delivery=setting)
            await hub.add_member("t", "bob", "llm")
            async with dispatching(hub) as d:
                sent = await hub.send("t", "bob", "alice", text, link=False)

                async def settled() -> str | None:
                    st = await hub.message_status("t", sent.message_id)
                    if st.state.value in ("delivered", "acked", "dead"):
                        return st.state.value
                    return "held" if any(w.state == "held" for w in d.status()) else None

                got = await eventually(settled, within=60, what="the message held or sent")
                screen = pane.screen()
                assert got == "held", f"typed after {typed!r}\n--- screen ---\n{screen}"
                if reason is not None:
                    held = next(w for w in d.status() if w.state == "held")
                    assert reason in (held.last_error or "")
                assert mark not in screen and shows in screen, screen

                def undone() -> bool:
                    if shows not in pane.screen():
                        return True
                    pane.pane.send_keys(undo, enter=False)
                    return False

                wait_until(undone, 30, f"{shows!r} gone", pane)
                await wait_state(hub, "t", sent.message_id, "acked", within=90)
                wait_until(
                    lambda: "Noted." in pane.screen().rpartition(mark)[2],
                    90,
                    "the answer to the message",
                    pane,
                )
                screen = pane.screen()
    return _asked_once(rig, mark, text, screen)


async def test_a_message_waits_while_the_user_types_a_command_into_the_cli_prompt(
    typing_rig: Rig,
) -> None:
    """The user typed ``/`` into the CLI's prompt, and its list of slash commands shows
    (Gemini CLI's under the input line, ``clear  Clear the screen and start a new
    session``...). Typed in after the ``/``, the message was run as a command (or the
    Enter picked the command chosen in the list), never reaching the model, and counted
    delivered. The message is held, and reaches the model once, as a prompt of its own,
    once the user deleted the ``/``."""
    shows = COMMANDS[typing_rig.runtime]
    await _held_while_the_user_types(typing_rig, "/", shows, "WHILE-THE-LIST-SHOWS", "BSpace")


async def test_a_message_waits_while_the_user_types_a_draft_into_the_cli_prompt(
    typing_rig: Rig,
) -> None:
    """The user typed part of a prompt of their own into the CLI and has not sent it.
    Typed in after it, the message was added to the draft and submitted with it: the
    model got the user's half-written text mixed with the message, and the user lost the
    draft. The message is held, the draft left intact on screen; once the user clears
    it (C-u), the message reaches the model once, as a prompt of its own, and the draft
    never does."""
    draft = "DRAFT-OF-THE-USER half written"
    asked = await _held_while_the_user_types(
        typing_rig,
        draft,
        draft,
        "WHILE-THE-USER-TYPES",
        "C-u",
        reason="prompt holds text the user is typing",
    )
    assert not [p for p in asked if "DRAFT-OF-THE-USER" in p], asked


async def test_a_one_character_draft_with_the_cursor_moved_onto_it_holds_the_message(
    typing_rig: Rig,
) -> None:
    """The user typed one character and pressed Left: Claude Code and Gemini CLI draw
    their cursor in reverse video over it, and the prompt read as empty (the cursor
    alone), so the message was pasted into the draft, before the character, and
    submitted with it. The message is held; once the user deletes the character
    (Delete, the cursor on it), it reaches the model once, as a prompt of its own."""
    asked = await _held_while_the_user_types(
        typing_rig,
        "ж",
        "ж",
        "WHILE-ONE-CHARACTER-WAITS",
        "Delete",
        reason="prompt holds text the user is typing",
        keys=["Left"],
    )
    assert not [p for p in asked if "ж" in p], asked


async def test_a_message_reaches_the_cli_in_a_pane_40_columns_wide(typing_rig: Rig) -> None:
    """In a pane 40 columns wide, Codex wraps its status line (model, working directory,
    thread title) over three rows, and the adapter took its prompt for the echo of an
    earlier one with an unknown panel under it: the message was held until ``hold_max``
    and given up. And a CLI wraps a text at a space, before a word that does not fit:
    the head of the message was not on the input's first row, so the adapter never saw
    its text in the prompt, pressed no Enter, and then took its own text for a draft of
    the user's. The message reaches the model once, as a prompt of its own."""
    rig = typing_rig
    mark = "NARROW-PANE"
    text = f"see https://example.com/docs/page {mark} 日本語のテキスト, emoji 🎉 please."
    with _warm_pane(rig, width=40) as (pane, setting):
        async with running_hub() as hub:
            await hub.add_member("t", "alice", rig.runtime, delivery=setting)
            await hub.add_member("t", "bob", "llm")
            async with dispatching(hub) as d:
                sent = await hub.send("t", "bob", "alice", text, link=False)

                async def acked() -> bool:
                    st = await hub.message_status("t", sent.message_id)
                    return st.state.value == "acked"

                await eventually(
                    acked,
                    within=60,
                    what="the message acked",
                    show=lambda: ([(w.state, w.last_error) for w in d.status()], pane.screen()),
                )
                wait_until(
                    lambda: "Noted." in pane.screen().rpartition("NARROW")[2],
                    90,
                    "the answer to the message",
                    pane,
                )
                screen = pane.screen()
    _asked_once(rig, mark, text, screen)


async def test_a_wide_character_draft_with_the_cursor_moved_onto_it_holds_the_message(
    typing_rig: Rig,
) -> None:
    """The user typed a character two cells wide (CJK) and pressed Left: tmux's cursor
    names the cell it starts at, the CLI draws it under its cursor, and the reader
    counts the line's cells as tmux does. The message is held; once the user deletes the
    character, it reaches the model once, as a prompt of its own."""
    asked = await _held_while_the_user_types(
        typing_rig,
        "語",
        "語",
        "WHILE-A-WIDE-CHARACTER-WAITS",
        "Delete",
        reason="prompt holds text the user is typing",
        keys=["Left"],
    )
    assert not [p for p in asked if "語" in p], asked
