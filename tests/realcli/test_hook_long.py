"""A message longer than a CLI takes in one hook answer, handed over by the real Claude
Code, Codex and Gemini CLI hooks: the model sees its start as sent, under the cap, and
the read_message call that reads it whole."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server

from .fake_anthropic import Reply, Request, Rule, call, say
from .harness import MODELS, Rig, attached

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(params=["claude-code", "codex", "gemini"])
def rig(
    request: pytest.FixtureRequest, server: Server, bin_dir: Path, tmp_path: Path
) -> Iterator[Rig]:
    with attached(request.param, server, bin_dir, tmp_path) as r:
        yield r


def long_text(size: int, tag: str) -> str:
    out = [f"{tag} start"]
    while sum(map(len, out)) + len(out) < size:
        out.append(f"{len(out):06d} a line of a long report, padded to be read whole")
    out.append(f"{tag} LAST-LINE")
    return "\n".join(out)


def test_a_long_message_a_hook_hands_over_is_shown_with_the_way_to_read_it_whole(
    rig: Rig,
) -> None:
    """100,000 characters waiting when the user's prompt comes: Claude Code saved the hook
    context to a file and showed the model a 2 KB preview, Codex cut its middle out, and
    the hub counted it delivered. The model now sees the message's start under the cap,
    as the hook gave it, with the ``read_message`` call that reads it whole."""
    text = long_text(100_000, "LONG")
    with rig.server.client(rig.tokens["bob"]) as c:
        r = c.post("/v1/messages", json={"to": "alice", "text": text})
        ident = r.json()["message_id"]
    rig.api = MODELS[rig.runtime].make([Rule(lambda q: bool(rig.model.tools(q)), say("Ok."))])
    rig.api.__enter__()
    rig.run("Anything new?")
    seen = [t for q in rig.api.requests for t in rig.model.texts(q) if "LONG start" in t]
    assert seen, "the message's start reached the model"
    said = f"call the backchannel tool read_message with message_id={ident!r}"
    for t in seen:
        assert said in t, t[-3000:]
        assert "Output too large" not in t and "truncated output" not in t, t[:3000]
        # its start, line by line, as sent (a runtime's own wrapping aside)
        start = t[t.index("LONG start") :].partition("\n[backchannel: this message")[0]
        assert text.startswith(start.rstrip("\n")) and len(start) > 4000, start[-300:]


def _note_call(shown: str) -> dict[str, Any] | None:
    """The read_message call a note in ``shown`` names, its arguments as written."""
    said = re.search(r"read_message with (message_id=[^\n]+?)(?: to read| for its)", shown)
    if said is None:
        return None
    args = dict(re.findall(r"(\w+)=('[^']*'|\d+)", said[1]))
    return {k: v.strip("'") if v.startswith("'") else int(v) for k, v in args.items()}


def _unwrapped(shown: str) -> str:
    """A text as the model reads it, a tool's answer out of the JSON a CLI shows it in
    (Claude Code and Codex its structured content, Gemini an ``output``)."""
    shown = re.sub(r"^Wall time: [^\n]*\nOutput:\n", "", shown)  # Codex's preamble
    if not shown.startswith("{"):
        return shown
    answer = json.loads(shown)
    return str(answer.get("text") or answer.get("output") or "")


def _body(shown: str) -> str:
    """The message's text in a hook's context or a read_message answer: what follows the
    header, up to the hub's note (the lines are plain: nothing to unframe)."""
    body = _unwrapped(shown).partition("[From bob] ")[2]
    return re.split(r"\n\(message_id: |\n\[backchannel: this message", body)[0]


def test_a_model_that_follows_the_hooks_note_reads_the_rest_once(rig: Rig) -> None:
    """The model follows the hook's note, and each answer's, through the CLI's own MCP
    client and the real ``backchannel mcp``: it read the message's first 6,000 bytes
    twice (the note sent it to part 1), and Codex, which keeps about 10 KB of a tool's
    answer (its start and end, "...N tokens truncated..." for the middle), lost the middle
    of every 30,000-byte part. The start and the parts it reads now join to the message,
    every character once."""
    text = long_text(50_000, "HALF") + "\nü中😀 the last line"
    with rig.server.client(rig.tokens["bob"]) as c:
        ident = c.post("/v1/messages", json={"to": "alice", "text": text}).json()["message_id"]
    made: list[dict[str, Any]] = []

    def follow(q: Request) -> Reply:
        calls = [a for t in rig.model.texts(q) if (a := _note_call(_unwrapped(t))) is not None]
        todo = [a for a in calls if a not in made]
        if not todo or len(made) >= 12:
            return say("Read it all.")
        made.append(todo[0])
        return call("mcp__backchannel__read_message", **todo[0])

    rig.api = MODELS[rig.runtime].make([Rule(lambda q: bool(rig.model.tools(q)), follow)])
    rig.api.__enter__()
    rig.run("Anything new?")
    last = [q for q in rig.api.requests if rig.model.tools(q)][-1]
    shown = [t for t in rig.model.texts(last) if "[From bob] " in t]
    assert made and made[0]["message_id"] == ident and "start" in made[0], made
    assert len(shown) == 1 + len(made), [s[-300:] for s in shown]
    read = "".join(_body(t) for t in shown)
    assert read == text, (len(read), len(text), made)  # every character once, in order


def test_codex_reads_a_long_member_list_whole_through_its_pages(
    server: Server, bin_dir: Path, tmp_path: Path
) -> None:
    """Codex keeps 10,000 bytes of a tool's answer: a ``list_members`` page of 50
    members of long names, one with 40 open sessions of long ids, was cut in its middle
    ("…tokens truncated…"), and the members there were never seen. The model follows
    each answer's own ``list_members(after=...)`` through the real Codex and the real
    ``backchannel mcp``, and is shown every member once, no answer cut."""
    with attached("codex", server, bin_dir, tmp_path) as rig:
        names = [f"m{i:02d}" + "x" * 61 for i in range(60)]
        tokens = make_team_members(rig, names)
        with server.client(tokens[names[3]]) as c:
            for i in range(40):
                body = {"session_id": f"{i:03d}-" + "s" * 195}
                c.post("/v1/sessions", json=body).raise_for_status()
        made: list[dict[str, Any]] = []

        def follow(q: Request) -> Reply:
            outputs = [_readable(t) for t in rig.model.texts(q) if "Team " + rig.team in t]
            if not outputs:
                made.append({})
                return call("mcp__backchannel__list_members")
            nxt = re.search(r'list_members\(after="([^"]+)"\)', outputs[-1])
            if nxt is None or len(made) >= 12:
                return say("Listed them all.")
            made.append({"after": nxt[1]})
            return call("mcp__backchannel__list_members", after=nxt[1])

        rig.api = MODELS["codex"].make([Rule(lambda q: bool(rig.model.tools(q)), follow)])
        rig.api.__enter__()
        rig.run("Who is on the team?")
        last = [q for q in rig.api.requests if rig.model.tools(q)][-1]
        shown = [t for t in rig.model.texts(last) if "Team " + rig.team in t]
        for t in shown:
            assert "truncated" not in t, t[:3000]
        assert len(shown) == len(made) > 1, made
        seen = [n for t in shown for n in re.findall(r"^- ([A-Za-z0-9_-]+)", _readable(t), re.M)]
        assert seen == sorted([*names, "alice", "bob", "user"]), seen


def _readable(shown: str) -> str:
    """A tool's answer as the model reads it; as shown when Codex cut its JSON."""
    try:
        return _unwrapped(shown)
    except json.JSONDecodeError:
        return shown


def make_team_members(rig: Rig, names: list[str]) -> dict[str, str]:
    """``names`` added to the rig's team (as llm members), and their tokens."""
    tokens = {}
    with rig.server.client() as c:
        for name in names:
            r = c.post(f"/v1/teams/{rig.team}/members", json={"name": name, "kind": "llm"})
            r.raise_for_status()
            tokens[name] = r.json()["token"]
    return tokens
