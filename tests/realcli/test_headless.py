"""The real CLIs, headless, attached with ``backchannel attach`` to a real hub, each
talking to a scripted model on 127.0.0.1: tools listed and called, hooks reaching the
hub, a link crossing both ways, closing-text dedup, a timer, a resume that keeps the
link, and an exit that loses no message. Nothing leaves the machine (the refusing proxy
records nothing)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server

from .fake_anthropic import Rule, call, say
from .harness import MODELS, Rig, attach, attached

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(600)]

RUNTIMES = ["claude-code", "codex", "gemini"]
TOOL = "mcp__backchannel__send_message"


@pytest.fixture(params=RUNTIMES)
def rig(
    request: pytest.FixtureRequest, server: Server, bin_dir: Path, tmp_path: Path
) -> Iterator[Rig]:
    with attached(request.param, server, bin_dir, tmp_path) as r:
        yield r


def _main(r: Rig) -> Any:
    """Requests of the agent loop (the ones that offer tools), not side requests."""
    return lambda q: bool(r.model.tools(q))


def _last_has(r: Rig, text: str) -> Any:
    main = _main(r)
    return lambda q: main(q) and text in r.model.last(q)


def _shown(r: Rig, text: str) -> Any:
    """The request shows the model ``text`` anywhere (hook context rides along with the
    prompt in a runtime's own wrapping)."""
    main = _main(r)
    return lambda q: main(q) and any(text in t for t in r.model.texts(q))


def _seen(r: Rig, text: str) -> bool:
    assert r.api is not None
    return any(text in t for q in r.api.requests for t in r.model.texts(q))


def _texts(msgs: list[dict[str, Any]]) -> list[str]:
    return [m["text"] for m in msgs if m["kind"] != "system"]


def _script(r: Rig, rules: list[Rule]) -> None:
    r.api = MODELS[r.runtime].make(rules)
    r.api.__enter__()


def test_tools_are_offered_and_called_and_hooks_reach_the_hub(rig: Rig) -> None:
    _script(
        rig,
        [
            Rule(_last_has(rig, "Tell bob"), call(TOOL, to="bob", message="build is green"), 1),
            Rule(_last_has(rig, "Sent to bob"), say("Told bob.")),
        ],
    )
    run = rig.run("Tell bob the build is green.")
    assert rig.api is not None
    # offered as a tool, or (Claude Code) named among the deferred tools it can load
    offered = json.dumps(rig.api.requests)
    assert "send_message" in offered and "backchannel" in offered
    # the message, then (the send opened a link) the turn's closing text crossing it
    assert _texts(rig.take("bob")) == ["build is green", "[From alice] Told bob."]
    kinds = [e["kind"] for e in rig.events(run.session_id)]
    for kind in ("turn_start", "tool_call", "tool_result", "agent_stop"):
        assert kind in kinds, kinds
    # the agent was told who it is (SessionStart's context reached the model)
    assert _seen(rig, "you are 'alice'")
    assert rig.session(run.session_id)["state"] == "exited"


def test_a_link_crosses_both_ways_across_a_resume_and_an_exit_loses_nothing(rig: Rig) -> None:
    _script(
        rig,
        [
            Rule(_last_has(rig, "Ask bob"), call(TOOL, to="bob", message="what is 6*7?"), 1),
            Rule(_last_has(rig, "Sent to bob"), say("Asked bob; waiting.")),
            Rule(_shown(rig, "[From bob] 42"), say("bob says 42; thanks bob.")),
        ],
    )
    first = rig.run("Ask bob what 6*7 is.")
    assert _texts(rig.take("bob")) == ["what is 6*7?", "[From alice] Asked bob; waiting."]
    [link] = rig.get("alice", "/v1/links")["links"]
    assert link["state"] == "open"
    assert rig.session(first.session_id)["state"] == "exited"

    # bob answers while alice's process is gone: the answer crosses the link and waits
    rig.peer_turn("42")
    assert rig.get("alice", "/v1/links")["links"][0]["state"] == "open"

    again = rig.run("Anything new?", resume=first.session_id)
    assert again.session_id == first.session_id
    assert _seen(rig, "[From bob] 42"), "the reply reached the model on resume"
    # alice's closing text crossed back to bob over the same link
    assert _texts(rig.take("bob", "bob-s")) == ["[From alice] bob says 42; thanks bob."]
    sessions = [
        s["session_id"] for s in rig.get("alice", "/v1/sessions", member="alice")["sessions"]
    ]
    assert sessions == [first.session_id], "a resume is the same hub session"


def test_closing_text_that_repeats_a_sent_message_is_not_sent_twice(rig: Rig) -> None:
    _script(
        rig,
        [
            Rule(_last_has(rig, "Report"), call(TOOL, to="bob", message="The answer is 42."), 1),
            Rule(_last_has(rig, "Sent to bob"), say("The answer is 42.")),
        ],
    )
    rig.run("Report the answer to bob.")
    assert _texts(rig.take("bob")) == ["The answer is 42."]


def test_a_timer_set_in_one_run_reaches_the_model_in_the_next(rig: Rig) -> None:
    note = "look at the build again"
    _script(
        rig,
        [
            Rule(
                _last_has(rig, "Remind"),
                call("mcp__backchannel__set_timer", intent="anchor", minutes=0.02, note=note),
                1,
            ),
            Rule(_last_has(rig, "cancel_timer"), say("Timer set.")),
        ],
    )
    first = rig.run("Remind yourself to look at the build.")
    rig.wait_for("the timer to fire", lambda: rig.get("alice", "/v1/timers")["timers"] == [])
    rig.run("Go on.", resume=first.session_id)
    assert _seen(rig, note), "the breadcrumb reached the model on resume"


def _keepers(url: str) -> list[str]:
    """The runtime keys the keepers beating to the hub at ``url`` beat for
    (:mod:`backchannel.runtimes.keeper`)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "backchannel.runtimes.keeper" in args and url in args:
            found.append(args[-2] if args[-1] == "" else args[-1])
    return found


@pytest.mark.parametrize("rig", ["claude-code"], indirect=True)
def test_claude_code_attached_over_http_is_told_who_it_is(rig: Rig) -> None:
    # hooks and MCP over HTTP; SessionStart stays a command (Claude Code runs no HTTP hook
    # for it), so the intro still reaches the model
    attach(rig.runtime, rig.project, rig.server.url, rig.team, "--http")
    vouched: list[list[str]] = []

    def tell_bob(_: Any) -> Any:
        # mid-run, no `backchannel mcp` runs under Claude Code: the keeper its SessionStart
        # hook started beats for it, and the hub takes it for the session's runtime
        [key] = _keepers(rig.server.url)
        with rig.server.client(rig.tokens["alice"]) as c:
            beat = c.post("/v1/sessions/alive", json={"runtime": key})
        vouched.append(beat.json()["sessions"])
        return call(TOOL, to="bob", message="over http")

    _script(
        rig,
        [
            Rule(_last_has(rig, "Tell bob"), tell_bob, 1),
            Rule(_last_has(rig, "Sent to bob"), say("Told bob.")),
        ],
    )
    run = rig.run("Tell bob it works over http.")
    assert _seen(rig, "you are 'alice'")
    assert _texts(rig.take("bob"))[0] == "over http"
    kinds = [e["kind"] for e in rig.events(run.session_id)]
    assert "tool_call" in kinds and "agent_stop" in kinds
    assert vouched == [[run.session_id]]
    # Claude Code has exited: its keeper follows
    rig.wait_for("the keeper to exit", lambda: not _keepers(rig.server.url))


def test_a_message_arriving_mid_turn_continues_that_turn_once(rig: Rig) -> None:
    def work(_: Any) -> Any:
        # bob writes while alice's turn runs: it waits for the turn's end, and the stop
        # hook hands it over as the input the CLI continues with
        with rig.server.client(rig.tokens["bob"]) as c:
            c.post("/v1/messages", json={"to": "alice", "text": "also do Z"}).raise_for_status()
        return say("Working on it.")

    _script(
        rig,
        [
            Rule(_last_has(rig, "Do Y"), work, 1),
            Rule(_shown(rig, "[From bob] also do Z"), say("Did Z too."), 1),
        ],
    )
    run = rig.run("Do Y.")
    events = rig.events(run.session_id)
    starts = [e for e in events if e["kind"] == "turn_start"]
    stops = [e["text"] for e in events if e["kind"] == "agent_stop"]
    assert len(starts) == 2, starts  # the prompt's turn and the one continuation
    assert starts[1]["data"].get("continued_by")
    # each closing text once: a continuation's report never repeats the text before it
    assert stops == ["Working on it.", "Did Z too."]
