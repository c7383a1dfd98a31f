"""A message longer than a CLI takes in one hook answer, handed over by the real Claude
Code, Codex and Gemini CLI hooks: the model sees its start as sent, under the cap, and
the read_message call that reads it whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server

from .fake_anthropic import Rule, say
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
