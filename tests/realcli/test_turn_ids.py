"""The real CLIs name each turn's end: Codex in its ``Stop`` hook's input (``turn_id``),
Gemini CLI in its ``AfterAgent`` call's (``timestamp``), Claude Code in the transcript
its ``Stop`` hook's input names (the uuid of the turn's last assistant message, which
``backchannel hook`` reads on the agent's machine). Two turns that end with
byte-identical words are two stops, and each crosses the link once; one ``Stop``
reported twice crosses once. The fixtures of ``tests/runtimes/test_repeated_stop.py``
say what the payloads carry; this checks it against the CLIs themselves (headless,
attached with ``backchannel attach``, a scripted model on 127.0.0.1, nothing leaving
the machine)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server

from .fake_anthropic import Rule, call, say
from .harness import MODELS, Rig, attached

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(600)]

TOOL = "mcp__backchannel__send_message"


@pytest.fixture(params=["claude-code", "codex", "gemini"])
def rig(
    request: pytest.FixtureRequest, server: Server, bin_dir: Path, tmp_path: Path
) -> Iterator[Rig]:
    with attached(request.param, server, bin_dir, tmp_path) as r:
        yield r


def _texts(msgs: list[dict[str, Any]]) -> list[str]:
    return [m["text"] for m in msgs if m["kind"] != "system"]


def _stop_marks(r: Rig, sid: str) -> list[dict[str, Any]]:
    """What the hub kept of each stop of ``sid`` to tell it from another (its
    ``last_stop`` mark: the runtime's id of the turn, when it gave one)."""
    stops = [e for e in r.events(sid) if e["kind"] == "agent_stop"]
    return [dict((e.get("data") or {}).get("last_stop") or {}) for e in stops]


def _script_done(r: Rig) -> None:
    """The model sends bob a message when told to, and else says ``Done.``."""
    model = MODELS[r.runtime]
    r.api = model.make(
        [
            Rule(
                lambda q: bool(model.tools(q)) and "Tell bob" in model.last(q),
                call(TOOL, to="bob", message="starting"),
                1,
            ),
            Rule(lambda q: True, say("Done.")),
        ]
    )
    r.api.__enter__()


def _hooks_file(r: Rig) -> Path:
    return {
        "claude-code": r.project / ".claude" / "settings.local.json",
        "codex": r.project / ".codex" / "hooks.json",
        "gemini": r.project / ".gemini" / "settings.json",
    }[r.runtime]


def _drop_prompt_hook(r: Rig) -> None:
    """Take the prompt hook (Claude Code's and Codex's ``UserPromptSubmit``, Gemini's
    ``BeforeAgent``) out of the project's hooks: the next turn starts without the hub
    hearing of it, as when that hook failed (or, for Claude Code, as a turn a channel
    push woke). Claude Code's ``SessionStart`` goes too (a resumed process's start makes
    the hub forget the stop before it), so only the turn's id is left to tell the two
    stops apart. Codex keys its trust by event and position, so the other handlers stay
    trusted."""
    events = {
        "claude-code": ("UserPromptSubmit", "SessionStart"),
        "codex": ("UserPromptSubmit",),
        "gemini": ("BeforeAgent",),
    }[r.runtime]
    path = _hooks_file(r)
    data = json.loads(path.read_text())
    for event in events:
        del data["hooks"][event]
    path.write_text(json.dumps(data, indent=2))


def _two_turns_ending_alike(r: Rig, *, prompt_hook: bool = True) -> None:
    first = r.run("Tell bob we are starting.")
    # the send opened a link; the turn's closing text crossed it
    assert _texts(r.take("bob")) == ["starting", "[From alice] Done."]
    if not prompt_hook:
        _drop_prompt_hook(r)

    again = r.run("Go on.", resume=first.session_id)
    assert again.session_id == first.session_id
    # the second turn ended with the very same words: a turn of its own, it crosses too
    assert _texts(r.take("bob")) == ["[From alice] Done."]

    marks = _stop_marks(r, first.session_id)
    assert len(marks) == 2, marks
    ids = [m.get("id") for m in marks]
    assert all(ids) and ids[0] != ids[1], f"{r.runtime}'s stops did not name their turns: {marks}"


def test_two_turns_that_end_with_the_same_words_each_cross_the_link(rig: Rig) -> None:
    _script_done(rig)
    _two_turns_ending_alike(rig)


def test_without_the_prompt_hook_the_turn_id_still_tells_the_two_stops_apart(rig: Rig) -> None:
    """No prompt hook reached the hub between the two turns, and the second ended within
    the repeat window with the same words: only the turn's id tells its stop from the
    first one's reported again."""
    _script_done(rig)
    _two_turns_ending_alike(rig, prompt_hook=False)


def _stop_hooks_run(r: Rig, sid: str) -> list[int]:
    """How many ``Stop`` hooks Claude Code ran at each turn's end (its transcript's
    ``stop_hook_summary`` entries)."""
    found: list[int] = []
    for transcript in (r.home / ".claude" / "projects").rglob(f"{sid}.jsonl"):
        for line in transcript.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("subtype") == "stop_hook_summary":
                found.append(entry.get("hookCount"))
    return found


@pytest.mark.parametrize("rig", ["claude-code"], indirect=True)
def test_a_claude_code_stop_reported_twice_crosses_once(rig: Rig) -> None:
    """Two ``Stop`` hooks of one session (the same hook in two settings files; the
    command differs, so Claude Code runs both) report the one turn's end twice: it
    crosses the link once, and the second report is told for what it is by the turn's id,
    not the closing text."""
    _script_done(rig)
    path = _hooks_file(rig)
    data = json.loads(path.read_text())
    stop = data["hooks"]["Stop"][0]["hooks"][0]
    again = {**stop, "command": stop["command"].replace(rig.server.url, rig.server.url + "/")}
    assert again["command"] != stop["command"]
    data["hooks"]["Stop"][0]["hooks"].append(again)
    path.write_text(json.dumps(data, indent=2))

    first = rig.run("Tell bob we are starting.")
    assert _stop_hooks_run(rig, first.session_id) == [2], "Claude Code did not run both hooks"
    assert _texts(rig.take("bob")) == ["starting", "[From alice] Done."]
    stops = [e for e in rig.events(first.session_id) if e["kind"] == "agent_stop"]
    assert len(stops) == 1, stops
    marks = _stop_marks(rig, first.session_id)
    assert marks[0].get("id"), f"claude-code's stop did not name its turn: {marks}"

    rig.run("Go on.", resume=first.session_id)
    assert _texts(rig.take("bob")) == ["[From alice] Done."]
    marks = _stop_marks(rig, first.session_id)
    assert len(marks) == 2 and marks[0]["id"] != marks[1]["id"], marks
