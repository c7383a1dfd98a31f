"""The real Codex and Gemini CLIs name each turn in their stop hook's input (Codex's
``Stop`` ``turn_id``, Gemini's ``AfterAgent`` ``timestamp``): two turns that end with
byte-identical words are two stops, and each crosses the link once. The fixtures of
``tests/runtimes/test_repeated_stop.py`` say what the payloads carry; this checks it
against the CLIs themselves (headless, attached with ``backchannel attach``, a scripted
model on 127.0.0.1, nothing leaving the machine)."""

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


@pytest.fixture(params=["codex", "gemini"])
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


def _drop_prompt_hook(r: Rig) -> None:
    """Take the prompt hook (Codex's ``UserPromptSubmit``, Gemini's ``BeforeAgent``) out
    of the project's hooks: the next turn starts without the hub hearing of it, as when
    that hook failed. Codex keys its trust by event and position, so the other handlers
    stay trusted."""
    path, event = {
        "codex": (r.project / ".codex" / "hooks.json", "UserPromptSubmit"),
        "gemini": (r.project / ".gemini" / "settings.json", "BeforeAgent"),
    }[r.runtime]
    data = json.loads(path.read_text())
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
