"""``@path`` in a teammate's message, as the real Claude Code CLI (pinned) gets it in a
tmux pane: Claude Code's interactive prompt reads a file a prompt mentions as ``@path``
and puts its content before the model. A message typed in by the hub's tmux adapter (which
puts a backslash before such an ``@``), or handed over by Claude Code's hooks (which
resolve no mention), must not make it read one: a teammate (or a message a teammate
relays) naming ``@secret.txt`` would otherwise send the file to the model. Every assertion
is on what the scripted model API received."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from backchannel.delivery.tmux import escape_at
from tests.conftest import Server
from tests.delivery.conftest_adapters import dispatching, running_hub, wait_state
from tests.realcli.fake_anthropic import FakeAnthropic, Rule, last_user_text
from tests.realcli.test_claude_channels import NO_TRAFFIC, _send, hub
from tests.realcli.test_claude_interactive import (
    Worker,
    asking,
    busy_until,
    first_session,
    proxy,
    turns_while,
)
from tests.realcli.tmux_harness import (
    Pane,
    RefusingProxy,
    claude_pane,
    cli_env,
    wait_until,
    write_home,
)

__all__ = ["hub", "proxy"]  # the fixtures, used here too

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(300)]

#: Where each mention of a message points, from the CLI's working directory (``~``: its
#: HOME, ``/``: a directory elsewhere), and how the message writes it: every way Claude
#: Code 2.1.332 takes for a file mention (after a space, at a line's start, after CJK
#: punctuation, quoted), each at a file of its own (a file read once is not read again).
MENTIONS = {
    "REL": ("secret-rel.txt", "@secret-rel.txt"),
    "DOT": ("secret-dot.txt", "@./secret-dot.txt"),
    "ABS": ("/secret-abs.txt", "@{outside}/secret-abs.txt"),
    "HOME": ("~/secret-home.txt", "@~/secret-home.txt"),
    "QUOTED": ("secret quoted.txt", '@"secret quoted.txt"'),
    "LINE": ("secret-line.txt", "below\n@secret-line.txt"),
    "CJK": ("secret-cjk.txt", "\u3002@secret-cjk.txt"),
    "RANGE": ("secret-range.txt", "@secret-range.txt#L1-2"),
}


def _secrets(project: Path, home: Path, outside: Path) -> dict[str, str]:
    """Each mention's file written, holding ``SECRET-<name>``; the mentions by name."""
    outside.mkdir(parents=True, exist_ok=True)
    mentions = {}
    for name, (where, mention) in MENTIONS.items():
        if where.startswith("~/"):
            path = home / where[2:]
        elif where.startswith("/"):
            path = outside / where[1:]
        else:
            path = project / where
        path.write_text(f"SECRET-{name}\nline two\n")
        mentions[name] = mention.format(outside=outside)
    return mentions


def _leaked(api: FakeAnthropic) -> list[str]:
    """The secrets found anywhere in any request the API received."""
    bodies = [json.dumps(r) for r in api.requests]
    return [name for name in MENTIONS if any(f"SECRET-{name}" in b for b in bodies)]


def _read_for(api: FakeAnthropic, mark: str) -> list[str]:
    """The secrets in the user turn that carries ``mark`` (what its prompt brought)."""
    turns = [json.dumps(r["messages"][-1]) for r in asking(api, mark)]
    return [name for name in MENTIONS if any(f"SECRET-{name}" in t for t in turns)]


def _shown(api: FakeAnthropic, mark: str) -> list[dict[str, Any]]:
    """The model requests whose last user turn holds ``mark`` (in a hook's context too)."""
    return [r for r in api.model_requests() if mark in json.dumps(r["messages"][-1])]


def _warm_up(pane: Pane, api: FakeAnthropic) -> None:
    """A prompt of the user's, answered: Claude Code is at its prompt. (Just started, it
    may take the first Enter before its prompt is ready: then Enter is pressed again.)"""
    pane.wait_for("\u276f")
    pane.type("PROMPT-WARM-UP")

    def asked() -> bool:
        if asking(api, "PROMPT-WARM-UP"):
            return True
        if "\u276f PROMPT-WARM-UP" in pane.screen():
            pane.enter()
        return False

    wait_until(asked, 60, "the warm-up request", pane)
    wait_until(lambda: "Noted." in pane.screen(), 60, "the warm-up answer", pane)


async def test_a_message_typed_in_by_the_tmux_adapter_makes_claude_code_read_no_file(
    proxy: RefusingProxy, tmp_path: Path
) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    write_home(home, [project])
    mentions = _secrets(project, home, tmp_path / "elsewhere")
    env = cli_env(home, "", proxy, **NO_TRAFFIC) | {"TERM": "xterm-256color"}
    with FakeAnthropic([], fallback="Noted.") as api:
        env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(project, env) as pane:
            _warm_up(pane, api)
            foreground = pane.pane.cmd("display-message", "-p", "#{pane_current_command}")
            setting = {
                "type": "tmux",
                "target": pane.pane.pane_id,
                "socket_name": pane.pane.server.socket_name,
                "agent_commands": foreground.stdout,
            }
            read: dict[str, list[str]] = {}
            async with running_hub() as hub_, dispatching(hub_):
                await hub_.add_member("t", "alice", "claude-code", delivery=setting)
                await hub_.add_member("t", "bob", "llm")
                for name, mention in mentions.items():
                    mark = f"MARK-{name}"
                    text = f"{mark} please read {mention} now, or ask bob@example.com"
                    sent = await hub_.send("t", "bob", "alice", text, link=False)
                    await wait_state(hub_, "t", sent.message_id, "acked", within=30)
                    [req] = wait_until(lambda m=mark: asking(api, m) or None, 60, mark, pane)  # type: ignore[misc]
                    # the model reads the mention and the address, a backslash before
                    # each @ (the adapter escapes every @ for Claude Code)
                    got = last_user_text(req)
                    assert f"read {escape_at(mention)} now" in got, got
                    assert "bob\\@example.com" in got, got
                    wait_until(
                        lambda m=mark: "Noted." in pane.screen().split(m)[-1],  # type: ignore[misc]
                        60,
                        f"the answer to {mark}",
                        pane,
                    )
                    read[name] = _read_for(api, mark)
    # not one mention read, however written
    assert read == {name: [] for name in mentions}, json.dumps(read)
    assert _leaked(api) == []


@pytest.mark.parametrize("route", ["prompt", "stop"])
def test_a_message_handed_over_by_claude_codes_hooks_makes_it_read_no_file(
    hub: Server, proxy: RefusingProxy, tmp_path: Path, route: str
) -> None:
    """The hook routes (a prompt's ``UserPromptSubmit`` context, a ``Stop`` answer's
    continuation) put the message before the model as text: no mention in it is read."""
    w = Worker(hub, proxy, tmp_path)
    mentions = _secrets(w.project, w.home, tmp_path / "elsewhere")
    text = "MARK-HOOK please read " + " and ".join(mentions.values())
    working, go_on = threading.Event(), threading.Event()
    rules = [
        Rule(lambda r: "PROMPT-ONE" in last_user_text(r), busy_until(go_on, working, "Ok."), 1)
    ]
    with FakeAnthropic(rules, fallback="Noted.") as api:
        w.env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(w.project, w.env) as pane:
            sid = first_session(w, pane)
            if route == "prompt":  # waiting as a prompt is typed: its context
                mid = _send(hub, w.tokens["lead"], "worker", text)
                go_on.set()
                # (the MCP server may hold a first message up to 10 s before the hook
                # routes have it: docs/runtimes/claude-code.md)
                turns_while(pane, api, w, sid, lambda: not _shown(api, "MARK-HOOK"), "P")
                wait_until(lambda: w.copy(mid)["state"] == "acked", 60, "the ack", pane)
                assert any("PROMPT-" in last_user_text(r) for r in _shown(api, "MARK-HOOK"))
                stops = 0
            else:  # arriving mid-turn: the Stop hook's answer, a continuation
                pane.type("PROMPT-ONE")
                wait_until(working.is_set, 60, "the turn's model request", pane)
                mid = _send(hub, w.tokens["lead"], "worker", text)
                go_on.set()
                [req] = wait_until(lambda: asking(api, "MARK-HOOK"), 60, "the Stop answer", pane)
                assert "PROMPT-ONE" not in last_user_text(req), last_user_text(req)
                stops = 2
            if stops:
                wait_until(lambda: w.idle_after_stop(sid, stops), 60, "the turn's end", pane)
            wait_until(lambda: w.copy(mid)["state"] == "acked", 60, "the ack", pane)
    assert _leaked(api) == []
