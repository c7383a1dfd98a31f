"""Codex and Gemini CLI as a user runs them: interactive, in a real tmux pane, in a project
set up by ``backchannel attach`` and nothing else but what the docs tell the user to do
(Codex: ``attach --trust-hooks``, ``codex --no-daemon``, its folder-trust prompt answered
in the pane; Gemini: the folder trusted as Gemini records it). The session starts and the agent is told who it is, the tools are
offered and a call reaches the hub, a message arriving mid-turn is handed over by the
stop hook and reaches the model exactly once, and quitting leaves the hub session exited
with a waiting message still waiting."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backchannel.delivery.tmux import dialog
from backchannel.testing import eventually_blocking
from tests.conftest import Server

from .fake_anthropic import Rule, call, say
from .harness import Rig, attach, attached, mcp_runtime
from .tmux_harness import Pane, cli_pane, wait_until

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(240)]

TOOL = "mcp__backchannel__send_message"
#: What each CLI shows once it takes a prompt, and its folder-trust question.
READY = {"codex": "Ask Codex to do anything", "gemini": "Type your message"}
TRUST = {"codex": "Trust this folder?"}
#: Codex's TUI fetches raw.githubusercontent.com/openai/codex/main/announcement_tip.toml
#: at every start, with no setting to stop it; the proxy refuses it.
CLI_OWN_SERVICES = {"codex": {"CONNECT raw.githubusercontent.com:443"}, "gemini": set()}


@pytest.fixture(params=["codex", "gemini"])
def rig(
    request: pytest.FixtureRequest, server: Server, bin_dir: Path, tmp_path: Path
) -> Iterator[Rig]:
    with attached(request.param, server, bin_dir, tmp_path) as r:
        yield r
        # the CLI's own refused attempts are allowed; anything else fails the test
        seen = set(r.proxy.seen)
        assert seen <= CLI_OWN_SERVICES[r.runtime], r.proxy.seen
        r.proxy.seen.clear()


def _start(rig: Rig) -> tuple[Path, list[str]]:
    """The user's side, as the docs have it, and the command `attach` says to run."""
    if rig.runtime == "codex":
        rig.write_codex_config(trusted=False)
        # the one-time grant `attach` prints: Codex skips hooks the user has not trusted
        attach("codex", rig.project, rig.server.url, rig.team, "--trust-hooks",
               env={"CODEX_HOME": str(rig.home / ".codex")})  # fmt: skip
        return rig.bin_dir / "codex", ["--no-daemon"]
    # the folder trusted as Gemini remembers it once the user said so: answering its
    # prompt in the pane (it then restarts) left Gemini untrusted in 2 of 3 tries here
    rig.write_gemini_config(trusted=True)
    return rig.bin_dir / "gemini", []


def _sessions(rig: Rig) -> list[dict[str, Any]]:
    return list(rig.get("alice", "/v1/sessions", member="alice")["sessions"])


def _delivery(rig: Rig, mid: str) -> dict[str, Any]:
    status = rig.get("bob", f"/v1/messages/{mid}")
    copy = next(d for d in status["deliveries"] if d["to"] == "alice")
    return {**copy, "history": status.get("history", [])}


def _count(rig: Rig, req: dict[str, Any], mark: str) -> int:
    """How often ``mark`` is in what ``req`` shows the model (its whole history)."""
    return sum(t.count(mark) for t in rig.model.texts(req))


def test_an_interactive_session_takes_part_and_exits_without_losing_a_message(
    rig: Rig,
) -> None:
    model = rig.model
    sent: list[str] = []

    def main(q: Any) -> bool:
        return bool(model.tools(q))

    def tell_bob_done(_: Any) -> Any:
        # bob writes while alice's turn runs: it waits for the turn's end, and the stop
        # hook hands it over as the input the CLI continues with
        with rig.server.client(rig.tokens["bob"]) as c:
            r = c.post("/v1/messages", json={"to": "alice", "text": "MARK-STOP: also do Z"})
            r.raise_for_status()
            sent.append(r.json()["message_id"])
        return say("Told bob.")

    rig.api = model.make(
        [
            Rule(
                lambda q: main(q) and "Tell bob" in model.last(q),
                call(TOOL, to="bob", message="build is green"),
                1,
            ),
            Rule(lambda q: main(q) and "Sent to bob" in model.last(q), tell_bob_done, 1),
            Rule(lambda q: main(q) and "MARK-STOP" in model.last(q), say("Did Z too."), 1),
            Rule(lambda q: main(q) and "Anything else" in model.last(q), say("Nothing."), 1),
        ]
    )
    rig.api.__enter__()
    binary, args = _start(rig)
    env = rig.env() | {"TERM": "xterm-256color"}
    started = time.monotonic()
    with cli_pane(binary, rig.project, env, *args) as pane:
        if rig.runtime == "codex":
            # a new project: Codex asks whether to trust it, and the user says yes (again,
            # if it was still starting and missed the key)
            pane.wait_for(TRUST[rig.runtime])
            wait_until(lambda: _trust(rig, pane), 60, "the folder's trust recorded", pane)
        if rig.runtime == "gemini":  # SessionStart opens the session at start
            wait_until(_sessions_if(rig), 60, "alice's hub session at start", pane)
        pane.wait_for(READY[rig.runtime])

        # the tools are offered and called; the hub sees the session and the call
        pane.type("Tell bob the build is green.")
        wait_until(
            lambda: len(sent) == 1 or _enter_again(pane, "Tell bob"),
            60,
            "the turn's send to bob",
            pane,
        )
        [session] = wait_until(_sessions_if(rig), 30, "alice's hub session", pane)
        sid = session["session_id"]
        first = next(q for q in _requests(rig) if "Tell bob" in model.last(q))
        assert TOOL.rsplit("__", 1)[-1] in " ".join(model.tools(first))
        # SessionStart told the agent who it is, in its very first request
        assert _count(rig, first, "you are 'alice'") == 1
        got = rig.get("bob", "/v1/inbox")["messages"]
        assert "build is green" in [m["text"] for m in got]

        # bob's message, sent mid-turn, is the stop hook's answer: the model gets it in
        # the request that continues the turn, once
        [cont] = wait_until(lambda: _asking(rig, "MARK-STOP"), 60, "the continuation", pane)
        assert _count(rig, cont, "[From bob] MARK-STOP: also do Z") == 1
        wait_until(lambda: _delivery(rig, sent[0])["state"] == "acked", 30, "its ack", pane)
        events = [h["event"] for h in _delivery(rig, sent[0])["history"]]
        assert events.count("leased") == events.count("acked") == 1, events
        wait_until(lambda: _idle(rig, sid), 30, "the turn's end", pane)

        # idle at its prompt, the session is vouched for by the CLI's MCP server: the
        # process it runs under is the one the hooks named for the session
        with rig.server.client(rig.tokens["alice"]) as c:
            beat = c.post("/v1/sessions/alive", json={"runtime": mcp_runtime(rig.team, "alice")})
        assert beat.json()["sessions"] == [sid], beat.text

        # the next prompt's request still shows it once: not handed over a second time
        pane.type("Anything else to do.")  # no "?": Gemini opens its shortcuts on it
        wait_until(
            lambda: _asking(rig, "Anything else") or _enter_again(pane, "Anything else"),
            60,
            "the next turn",
            pane,
        )
        for later in _asking(rig, "Anything else"):
            assert _count(rig, later, "[From bob] MARK-STOP") == 1
        wait_until(lambda: _idle(rig, sid, turns=2), 30, "the next turn's end", pane)

        # a message for the idle session waits; quitting the CLI ends the hub session
        # and leaves the message waiting for the next one
        with rig.server.client(rig.tokens["bob"]) as c:
            r = c.post("/v1/messages", json={"to": "alice", "text": "MARK-WAIT: later"})
            r.raise_for_status()
            waiting = r.json()["message_id"]
        _quit(pane)
        wait_until(lambda: rig.session(sid)["state"] == "exited", 30, "the session's exit")
    took = time.monotonic() - started
    assert not _seen_anywhere(rig, "MARK-WAIT")
    assert _delivery(rig, waiting)["state"] != "acked"
    assert [m["text"] for m in rig.take("alice")] == ["MARK-WAIT: later"]
    assert [s["session_id"] for s in _sessions(rig)] == [sid]
    print(f"\n{rig.runtime}: interactive session, start to exit, {took:.1f} s")


def _alive_past(session: dict[str, Any], when: float) -> bool:
    """The session is idle and showed a sign of life after ``when`` (an ended session's
    record is written when it ends: that is no sign of life)."""
    if session["state"] != "idle":
        assert session["state"] != "terminated", session
        return False
    return float(session["updated_at"]) > when


#: The exit grace of the team whose CLI runs idle on the HTTP MCP server.
IDLE_GRACE_S = 6


@pytest.mark.parametrize("runtime", ["codex", "gemini"])
def test_over_http_an_idle_cli_keeps_its_session_and_a_killed_one_ends(
    runtime: str, server: Server, bin_dir: Path, tmp_path: Path
) -> None:
    """Attached with ``--http``, no ``backchannel mcp`` runs under the CLI; idle at its
    prompt with a message waiting for its session, the session outlives the exit grace
    (the keeper its hooks started beats for it), and once the CLI is killed (``kill -9``
    of its process group) the session ends by the hub's rule."""
    with attached(runtime, server, bin_dir, tmp_path, exit_grace_seconds=IDLE_GRACE_S) as rig:
        attach(runtime, rig.project, rig.server.url, rig.team, "--http")
        model = rig.model
        hello = Rule(lambda q: bool(model.tools(q)) and "Hello" in model.last(q), say("Hi."), 1)
        rig.api = model.make([hello])
        rig.api.__enter__()
        binary, args = _start(rig)
        if runtime == "codex":  # --trust-hooks granted the stdio hooks; these are others
            attach(runtime, rig.project, rig.server.url, rig.team, "--http", "--trust-hooks",
                   env={"CODEX_HOME": str(rig.home / ".codex")})  # fmt: skip
        env = rig.env() | {"TERM": "xterm-256color"}
        with cli_pane(binary, rig.project, env, *args) as pane:
            if runtime == "codex":
                pane.wait_for(TRUST[runtime])
                wait_until(lambda: _trust(rig, pane), 60, "the folder's trust recorded", pane)
                pane.wait_for(READY[runtime])
                # Codex opens its session with its first prompt's SessionStart
                pane.type("Hello there.")
            [session] = wait_until(_sessions_if(rig), 60, "alice's hub session at start", pane)
            sid = session["session_id"]
            if runtime == "codex":
                wait_until(lambda: _idle(rig, sid), 60, "the first turn's end", pane)
            pane.wait_for(READY[runtime])
            with rig.server.client(rig.tokens["bob"]) as c:
                c.post(
                    "/v1/messages", json={"to": "alice", "session": sid, "text": "MARK-IDLE"}
                ).raise_for_status()
            since = time.time()
            # idle at its prompt for more than the grace: the beats are its signs of life
            wait_until(
                lambda: _alive_past(rig.session(sid), since + IDLE_GRACE_S),
                60,
                "a beat written past the grace",
                pane,
            )
            leader = int(pane.pane.cmd("display-message", "-p", "#{pane_pid}").stdout[0])
            os.killpg(leader, signal.SIGKILL)
            wait_until(
                lambda: rig.session(sid)["state"] == "terminated",
                60,
                "the killed CLI's session to end",
            )
        assert not _seen_anywhere(rig, "MARK-IDLE")
        assert [m["text"] for m in rig.take("alice")] == ["MARK-IDLE"]
        assert set(rig.proxy.seen) <= CLI_OWN_SERVICES[runtime], rig.proxy.seen
        rig.proxy.seen.clear()


def _trust(rig: Rig, pane: Pane) -> bool:
    """Answers the trust prompt (Enter: its first choice, trust this folder), then whether
    the CLI recorded the trust within a few seconds."""
    pane.enter()
    if rig.runtime == "codex":
        where, what = rig.home / ".codex" / "config.toml", f'[projects."{rig.project}"]'
    else:
        where, what = rig.home / ".gemini" / "trustedFolders.json", f'"{rig.project}"'
    try:
        eventually_blocking(
            lambda: where.exists() and what in where.read_text(), what="the trust", within=5
        )
    except AssertionError:
        return False
    return True


#: How long a text must have waited in the prompt since the last Enter before
#: :func:`_enter_again` presses another: a CLI busy taking the first one still shows
#: the text for a moment, and an Enter more would land in what it shows next (a tool's
#: approval dialog takes it as its user's "yes").
ENTER_AGAIN_AFTER = 1.0


def _enter_again(pane: Pane, typed: str) -> None:
    """Enter once more when the prompt still holds ``typed`` a second after the last
    Enter, as a user does when the CLI, just done with a turn, missed the key (Gemini
    CLI 0.61.0 sometimes does; Claude Code's prompt is ``❯``), and never while the CLI
    shows a dialog of its own (the conversation's echo of the prompt above it would
    match). For ``/quit`` only until the CLI exits: once the input line is gone the
    conversation's echo would match."""
    if time.monotonic() - pane.pressed < ENTER_AGAIN_AFTER:
        return
    screen = pane.screen()
    prompts = [ln for ln in screen.splitlines() if ln.lstrip().startswith((">", "›", "❯"))]
    # the input line, below the conversation, with no dialog under it
    if prompts and typed in prompts[-1] and dialog(screen) is None:
        pane.enter()


def _quit(pane: Pane) -> None:
    """Type ``/quit`` until the CLI exits. Gemini CLI runs its ``AfterAgent`` hook (the
    hub's end of the turn) while it still counts itself responding, and refuses a slash
    command entered in between ("Slash commands cannot be queued"), leaving it in the
    input line: a user presses Enter again once the CLI is done (no refusal shown, no
    "esc to cancel"), and again if the key still finds it busy."""
    pane.type("/quit")
    pressed = [time.monotonic()]

    def gone() -> bool:
        if pane.exited():
            return True
        screen = pane.screen()
        busy = "cannot be queued" in screen or "esc to cancel" in screen
        if not busy and time.monotonic() - pressed[0] >= 1:  # the last key had its time
            pressed[0] = time.monotonic()
            _enter_again(pane, "/quit")
        return False

    wait_until(gone, 45, "the CLI to exit", pane)


def _sessions_if(rig: Rig) -> Any:
    return lambda: _sessions(rig) or None


def _requests(rig: Rig) -> list[dict[str, Any]]:
    """The agent loop's requests (the ones that offer tools), not side requests."""
    assert rig.api is not None
    return [q for q in list(rig.api.requests) if rig.model.tools(q)]


def _asking(rig: Rig, mark: str) -> list[dict[str, Any]]:
    return [q for q in _requests(rig) if mark in rig.model.last(q)]


def _seen_anywhere(rig: Rig, mark: str) -> bool:
    assert rig.api is not None
    return any(mark in t for q in rig.api.requests for t in rig.model.texts(q))


def _idle(rig: Rig, sid: str, turns: int = 1) -> bool:
    """The session is between turns, after ``turns`` prompts (a continuation is part of
    its prompt's turn). The events are read before the state: a state read first could
    be the idle of the session just opened, and the events read next already hold the
    prompt's turn start, so a turn under way would pass for one that ended (Codex opens
    its session with its first prompt's ``SessionStart``)."""
    starts = [
        e for e in rig.events(sid)
        if e["kind"] == "turn_start" and not e["data"].get("continued_by")
    ]  # fmt: skip
    return bool(len(starts) >= turns and rig.session(sid)["state"] == "idle")


def test_codex_new_leaves_the_old_conversation_and_what_was_pinned_to_it_arrives_once(
    server: Server, bin_dir: Path, tmp_path: Path
) -> None:
    """Codex's ``/new`` starts another conversation in the same process: a ``SessionStart``
    of source ``startup`` with the new id at its first prompt, and no ``SessionEnd`` for
    the old one. The old hub session exits (the process left it) instead of staying idle
    while the process's MCP server beats for it; a message pinned to it reaches the new
    conversation once its exit grace is over, once."""
    with attached("codex", server, bin_dir, tmp_path, exit_grace_seconds=IDLE_GRACE_S) as rig:
        rig.api = rig.model.make([])
        rig.api.__enter__()
        binary, args = _start(rig)
        env = rig.env() | {"TERM": "xterm-256color"}
        with cli_pane(binary, rig.project, env, *args) as pane:
            pane.wait_for(TRUST["codex"])
            wait_until(lambda: _trust(rig, pane), 60, "the folder's trust recorded", pane)
            pane.wait_for(READY["codex"])
            pane.type("PROMPT-ONE hello")
            [session] = wait_until(_sessions_if(rig), 60, "alice's hub session", pane)
            old = session["session_id"]
            wait_until(lambda: _idle(rig, old), 60, "the first turn's end", pane)
            with rig.server.client(rig.tokens["bob"]) as c:
                body = {"to": "alice", "session": old, "text": "MARK-PINNED: for the old one"}
                c.post("/v1/messages", json=body).raise_for_status()
            _new_conversation(pane)
            pane.enter()
            pane.wait_for(READY["codex"])
            pane.type("PROMPT-TWO again")
            [new] = wait_until(
                lambda: (
                    [s["session_id"] for s in _sessions(rig) if s["session_id"] != old]
                    or _enter_again(pane, "PROMPT-TWO")
                ),
                60,
                "the new conversation's session",
                pane,
            )
            wait_until(lambda: _idle(rig, new), 60, "the new conversation's turn", pane)
            assert rig.session(old)["state"] in ("exited", "terminated")
            wait_until(lambda: rig.session(old)["state"] == "terminated", 60, "the old one's end")
            pane.type("PROMPT-THREE more")
            wait_until(
                lambda: _showing(rig, "PROMPT-THREE") or _enter_again(pane, "PROMPT-THREE"),
                60,
                "PROMPT-THREE",
            )
            wait_until(lambda: _idle(rig, new, turns=2), 60, "the third turn's end", pane)
            three = _showing(rig, "PROMPT-THREE")[-1]
            assert _count(rig, three, "MARK-PINNED: for the old one") == 1
            pane.type("PROMPT-FOUR last")
            wait_until(
                lambda: _showing(rig, "PROMPT-FOUR") or _enter_again(pane, "PROMPT-FOUR"),
                60,
                "PROMPT-FOUR",
            )
            wait_until(lambda: _idle(rig, new, turns=3), 60, "the fourth turn's end", pane)
            four = _showing(rig, "PROMPT-FOUR")[-1]
            assert _count(rig, four, "MARK-PINNED: for the old one") == 1
            assert _count(rig, four, "PROMPT-ONE") == 0  # a new conversation
        assert set(rig.proxy.seen) <= CLI_OWN_SERVICES["codex"], rig.proxy.seen
        rig.proxy.seen.clear()


def _new_conversation(pane: Pane) -> None:
    """Type Codex's ``/new`` until it asks where the new conversation runs. Codex runs the
    Stop hook (the hub's end of the turn) before its TUI counts the task done, and
    refuses ``/new`` typed in between ("disabled while a task is in progress"): a user
    types it again; and presses Enter again when ``/new`` is still in the input line a
    second after the last key with no refusal (typed again as the task ended, its Enter
    was not taken)."""
    refusal = "'/new' is disabled while a task"
    refused = [pane.screen().count(refusal)]
    pane.type("/new")
    keyed = [time.monotonic()]

    def asked() -> bool | None:
        screen = pane.screen()
        if "Use current" in screen:  # where the new conversation runs
            return True
        if screen.count(refusal) > refused[0]:
            refused[0] = screen.count(refusal)
            pane.type("/new")
            keyed[0] = time.monotonic()
        elif time.monotonic() - keyed[0] >= 1:  # the last key had its time
            keyed[0] = time.monotonic()
            _enter_again(pane, "/new")
        return None

    wait_until(asked, 60, "Codex asking where /new runs", pane)


def _showing(rig: Rig, mark: str) -> list[dict[str, Any]]:
    """The agent loop's requests that show ``mark`` anywhere (a prompt with context added
    by its hook is not the request's last text)."""
    return [q for q in _requests(rig) if _count(rig, q, mark)]
