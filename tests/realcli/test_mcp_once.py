"""Claude Code, headless, gives up on a ``send_message`` the hub stored but is slow to
answer (``MCP_TOOL_TIMEOUT``); its model, told the call timed out, sends again: the
peer gets the message once. The MCP server reaches the hub through a proxy that holds
the hub's answer to the first send until the model has made its second call."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server
from tests.test_sdk_faults import Faulty

from .fake_anthropic import Rule, call, say
from .harness import MODELS, Rig, attach, attached

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(600)]

TOOL = "mcp__backchannel__send_message"


@pytest.fixture
def rig(server: Server, bin_dir: Path, tmp_path: Path) -> Iterator[Rig]:
    with attached("claude-code", server, bin_dir, tmp_path) as r:
        yield r


def test_a_send_claude_code_timed_out_and_its_model_made_again_reaches_the_peer_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = MODELS["claude-code"]
    rules = [
        Rule(lambda q: "Tell bob" in model.last(q), call(TOOL, to="bob", message="ship it"), 1),
        # the runtime's timeout error: the model sends again, as models do
        Rule(lambda q: "timed out" in model.last(q), call(TOOL, to="bob", message="ship it"), 1),
        Rule(lambda q: "sent to bob" in model.last(q).lower(), say("Told bob.")),
    ]
    rig.api = model.make(rules)
    rig.api.__enter__()
    with contextlib.closing(Faulty(rig.server.url)) as proxy:
        proxy.faults.append(("POST", "/v1/messages", "late"))
        attach(rig.runtime, rig.project, proxy.url, rig.team)  # the MCP server's hub
        env = rig.env

        def slow_env() -> dict[str, str]:
            return {**env(), "MCP_TOOL_TIMEOUT": "3000"}

        monkeypatch.setattr(rig, "env", slow_env)

        def release() -> None:
            # the hub stored the first send; its answer goes on once the model, told
            # the call timed out, has made the call again
            assert rig.api is not None
            api = rig.api
            if proxy.answered.wait(60):
                rig.wait_for(
                    "the model's second call",
                    lambda: any("timed out" in model.last(q) for q in api.requests),
                    timeout=60,
                )
            proxy.release.set()

        releasing = threading.Thread(target=release, daemon=True)
        releasing.start()
        run = rig.run("Tell bob to ship it.")
        releasing.join(70)
    got = [m["text"] for m in rig.take("bob") if m["kind"] != "system"]
    assert got.count("ship it") == 1, got
    assert rig.api is not None
    shown = [model.last(q) for q in rig.api.requests]
    assert any("timed out" in s for s in shown), shown
    assert any("Already sent to bob" in s for s in shown), shown
    assert run.returncode == 0
