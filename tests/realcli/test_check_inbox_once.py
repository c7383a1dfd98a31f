"""A message the real Claude Code, Codex and Gemini CLIs read through ``check_inbox``
reaches the model once: Claude Code and Codex show the model the tool's structured
content, which carried each message's text a second time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server

from .fake_anthropic import Reply, Request, Rule, call, say
from .harness import MODELS, Rig, attached

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(600)]

MARK = "MARK-ONCE"


@pytest.fixture(params=["claude-code", "codex", "gemini"])
def rig(
    request: pytest.FixtureRequest, server: Server, bin_dir: Path, tmp_path: Path
) -> Iterator[Rig]:
    with attached(request.param, server, bin_dir, tmp_path) as r:
        yield r


def test_a_message_check_inbox_reads_reaches_the_model_once(rig: Rig) -> None:
    def check(q: Request) -> Reply:
        # sent during the turn: the prompt's hook has handed over what waited before
        with rig.server.client(rig.tokens["bob"]) as c:
            c.post("/v1/messages", json={"to": "alice", "text": f"{MARK} the build is green"})
        return call("mcp__backchannel__check_inbox")

    asked = [Rule(lambda q: bool(rig.model.tools(q)), check, 1), Rule(lambda q: True, say("Ok."))]
    rig.api = MODELS[rig.runtime].make(asked)
    rig.api.__enter__()
    rig.run("Check your inbox.")
    last = [q for q in rig.api.requests if rig.model.tools(q)][-1]
    seen = json.dumps(last, ensure_ascii=False)
    assert seen.count(MARK) == 1, seen[seen.find(MARK) - 300 :][:1200]
    assert f"[From bob] {MARK} the build is green" in "\n".join(rig.model.texts(last))
