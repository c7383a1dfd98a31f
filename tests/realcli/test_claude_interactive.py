"""The real Claude Code CLI (pinned, from npm) as a user drives it in a tmux pane,
attached with ``backchannel attach claude-code`` to a real ``backchannel serve``, its model
a scripted API on 127.0.0.1: quitting and coming back (``/exit``, Ctrl-C twice, then
``claude --continue`` / ``--resume <id>``), ``/clear``, ``/compact``, Esc mid-turn, and two
windows of one member. Every assertion is on what the model API received."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server
from tests.realcli.fake_anthropic import FakeAnthropic, Rule, call, last_user_text, say, texts
from tests.realcli.test_claude_channels import (
    NO_TRAFFIC,
    _attach,
    _get,
    _hub_turn,
    _send,
    _team,
    hub,
)
from tests.realcli.tmux_harness import (
    Pane,
    RefusingProxy,
    claude_pane,
    cli_env,
    wait_until,
    write_home,
)

__all__ = ["hub"]  # the fixture, used here too

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def proxy() -> Iterator[RefusingProxy]:
    p = RefusingProxy()
    try:
        yield p
    finally:
        p.close()
    assert p.attempts == [], p.attempts


class Worker:
    """worker's project, attached, with its home and environment; lead is hub-side."""

    def __init__(self, hub: Server, proxy: RefusingProxy, tmp_path: Path) -> None:
        self.hub = hub
        self.tokens = _team(hub)
        self.project = tmp_path / "worker"
        _attach(hub, self.project)
        self.home = tmp_path / "home"
        write_home(self.home, [self.project])
        self.env = cli_env(self.home, "", proxy, **NO_TRAFFIC)
        self.env["BACKCHANNEL_TOKEN"] = self.tokens["worker"]

    def sessions(self) -> list[dict[str, Any]]:
        found = _get(self.hub, self.tokens["worker"], "/v1/sessions", member="worker")
        return list(found["sessions"])

    def session(self, sid: str) -> dict[str, Any]:
        return dict(_get(self.hub, self.tokens["worker"], f"/v1/sessions/{sid}"))

    def live(self) -> list[dict[str, Any]]:
        return [s for s in self.sessions() if s["state"] in ("idle", "active")]

    def copy(self, mid: str) -> dict[str, Any]:
        status = _get(self.hub, self.tokens["lead"], f"/v1/messages/{mid}")
        return {**status["deliveries"][0], "history": status.get("history", [])}

    def stops(self, sid: str) -> int:
        """How many turn ends session ``sid`` reported."""
        events = _get(self.hub, self.tokens["worker"], f"/v1/sessions/{sid}/transcript")
        return sum(e["kind"] == "agent_stop" for e in events["events"])

    def idle_after_stop(self, sid: str, stops: int) -> bool:
        """Whether session ``sid`` is idle with ``stops`` turn ends reported."""
        return self.session(sid)["state"] == "idle" and self.stops(sid) >= stops


def asking(api: FakeAnthropic, mark: str) -> list[dict[str, Any]]:
    """The model requests whose last user turn carries ``mark``."""
    return [r for r in api.model_requests() if mark in last_user_text(r)]


def shown(req: dict[str, Any], mark: str) -> int:
    """How often ``mark`` is in what ``req`` shows the model (its whole history)."""
    return sum(t.count(mark) for t in texts({"messages": req.get("messages", [])}))


def prompt_turn(pane: Pane, api: FakeAnthropic, w: Worker, text: str, sid: str) -> Any:
    """Type ``text``; the request that carries it, once its turn ended."""
    before = w.stops(sid)
    pane.type(text)
    (req,) = wait_until(lambda: asking(api, text), 60, f"the request of {text!r}", pane)
    wait_until(lambda: w.idle_after_stop(sid, before + 1), 60, f"the end of {text!r}", pane)
    return req


def ctrl_c_twice(pane: Pane) -> None:
    """Ctrl-C until Claude Code says it exits on the next one, then that one. Claude Code
    runs its Stop hook (the hub's end of the turn) before it counts the turn done, and
    takes a Ctrl-C in between for an interrupt of the turn ("Interrupted"), not the first
    of the two that exit: a user presses it again. Its "again to exit" shows for a
    moment only: a key that finds neither (a busy box read the screen too late) is
    pressed again after two seconds, as a user would; one that exits ends it too."""
    interrupted = "Interrupted ·"
    seen = [pane.screen().count(interrupted)]
    pressed = [time.monotonic()]

    def press() -> None:
        pane.pane.send_keys("C-c", enter=False)
        pressed[0] = time.monotonic()

    press()

    def armed() -> bool | None:
        if pane.exited():
            return True
        screen = pane.screen()
        if "again to exit" in screen:
            return True
        if screen.count(interrupted) > seen[0]:
            seen[0] = screen.count(interrupted)
            press()
        elif time.monotonic() - pressed[0] >= 2:
            press()
        return None

    wait_until(armed, 60, "Claude Code's 'again to exit'", pane)
    if not pane.exited():
        pane.pane.send_keys("C-c", enter=False)


def first_session(w: Worker, pane: Pane) -> str:
    [s] = wait_until(lambda: w.live() or None, 60, "worker's hub session", pane)
    return str(s["session_id"])


@pytest.mark.parametrize(("quit_by", "back_by"), [("/exit", "--continue"), ("ctrl-c", "--resume")])
def test_a_message_waiting_when_the_user_quits_reaches_the_resumed_conversation_once(
    hub: Server, proxy: RefusingProxy, tmp_path: Path, quit_by: str, back_by: str
) -> None:
    w = Worker(hub, proxy, tmp_path)
    with FakeAnthropic([], fallback="Noted.") as api:
        w.env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(w.project, w.env) as pane:
            sid = first_session(w, pane)
            prompt_turn(pane, api, w, "PROMPT-ONE", sid)
            if quit_by == "/exit":
                pane.type("/exit")
            else:
                ctrl_c_twice(pane)
            wait_until(pane.exited, 60, "Claude Code's exit", pane)
        wait_until(lambda: w.session(sid)["state"] == "exited", 30, "the session exited")

        # lead, hub-side, messages worker; then from a turn of its own (opening a link),
        # whose closing text crosses the link: all three wait for worker
        direct = _send(hub, w.tokens["lead"], "worker", "MARK-DIRECT: also this")
        _hub_turn(hub, w.tokens["lead"], "lead-s", "MARK-CROSS: crossing", send="MARK-SEND: hi")

        back = ["--continue"] if back_by == "--continue" else ["--resume", sid]
        with claude_pane(w.project, w.env, *back) as pane:
            wait_until(lambda: w.session(sid)["state"] == "idle", 60, "the resumed session", pane)
            req = prompt_turn(pane, api, w, "PROMPT-TWO", sid)
            for mark in ("MARK-SEND: hi", "MARK-CROSS: crossing", "MARK-DIRECT: also this"):
                assert shown(req, mark) == 1, (mark, texts(req))
            # the earlier conversation is the one resumed
            assert shown(req, "PROMPT-ONE") == 1
            wait_until(lambda: w.copy(direct)["state"] == "acked", 30, "the ack", pane)
            later = prompt_turn(pane, api, w, "PROMPT-THREE", sid)
            for mark in ("MARK-SEND: hi", "MARK-CROSS: crossing", "MARK-DIRECT: also this"):
                assert shown(later, mark) == 1, (mark, texts(later))
        assert [s["session_id"] for s in w.sessions()] == [sid]


def turns_until(
    pane: Pane, api: FakeAnthropic, w: Worker, sid: str, mids: list[str], name: str
) -> Any:
    """Prompts typed in ``pane`` (session ``sid``) until messages ``mids`` are acked; the
    request of one more, whose history shows all the window's conversation. (Without
    channels enabled the MCP server's first push holds a message up to 10 s before the
    hook routes have it: docs/runtimes/claude-code.md.)"""
    return turns_while(
        pane, api, w, sid, lambda: any(w.copy(mid)["state"] != "acked" for mid in mids), name
    )


def turns_while(
    pane: Pane, api: FakeAnthropic, w: Worker, sid: str, waiting: Callable[[], bool], name: str
) -> Any:
    """Prompts typed in ``pane`` (session ``sid``) while ``waiting()``, then one more;
    that last one's request."""
    for i in range(30):
        if not waiting():
            break
        prompt_turn(pane, api, w, f"PROMPT-{name}{i}X", sid)
    return prompt_turn(pane, api, w, f"PROMPT-{name}-LAST", sid)


def busy_until(go_on: threading.Event, working: threading.Event, text: str) -> Any:
    """A model reply that holds its turn open until the test says ``go_on``."""

    def reply(_: dict[str, Any]) -> Any:
        working.set()
        go_on.wait(60)
        return say(text)

    return reply


def test_clear_keeps_what_waits_for_the_old_conversation_and_hands_the_rest_over_once(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    """``/clear`` ends the conversation (``SessionEnd``, reason ``clear``) and starts
    another under a new session id (``SessionStart``, source ``clear``): a new hub
    session. A message handed over by the last ``Stop`` hook was the old conversation's
    and is not shown again; one for the member waiting meanwhile goes to the new
    conversation once, and so does a peer's send; a link's crossing, pinned to the old session, waits for it (a
    resume) and reaches it once."""
    w = Worker(hub, proxy, tmp_path)
    working, go_on = threading.Event(), threading.Event()
    rules = [
        Rule(lambda r: "PROMPT-ONE" in last_user_text(r), busy_until(go_on, working, "Ok."), 1)
    ]
    with FakeAnthropic(rules, fallback="Noted.") as api:
        w.env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(w.project, w.env) as pane:
            sid = first_session(w, pane)
            pane.type("PROMPT-ONE")
            wait_until(working.is_set, 60, "the turn's model request", pane)
            handed = _send(hub, w.tokens["lead"], "worker", "MARK-HANDED: by the stop hook")
            go_on.set()
            wait_until(lambda: asking(api, "MARK-HANDED"), 60, "the Stop answer", pane)
            wait_until(lambda: w.idle_after_stop(sid, 2), 60, "the continuation's end", pane)

            direct = _send(hub, w.tokens["lead"], "worker", "MARK-DIRECT: waiting")
            _hub_turn(hub, w.tokens["lead"], "lead-s", "MARK-CROSS: crossing", send="MARK-SEND: hi")
            lead_sent = _get(hub, w.tokens["lead"], "/v1/sessions/lead-s/transcript")["events"]
            [send] = [e["data"]["message_id"] for e in lead_sent if e["kind"] == "sent"]
            pane.type("/clear")
            new = wait_until(
                lambda: [s for s in w.live() if s["session_id"] != sid] or None,
                60,
                "the new conversation's session",
                pane,
            )
            [fresh] = new
            assert w.session(sid)["state"] == "exited"
            req = turns_until(pane, api, w, fresh["session_id"], [direct, send], "TWO")
            assert shown(req, "PROMPT-ONE") == 0  # a new conversation
            assert shown(req, "MARK-HANDED") == 0
            assert shown(req, "MARK-DIRECT: waiting") == 1
            # lead's send names the member, not a session: it is the new conversation's
            assert shown(req, "MARK-SEND: hi") == 1 and shown(req, "MARK-CROSS") == 0
            assert w.copy(handed)["state"] == "acked"
            events = [h["event"] for h in w.copy(handed)["history"]]
            assert events.count("leased") == 1, events
            pane.type("/exit")
            wait_until(pane.exited, 60, "Claude Code's exit", pane)

        # the old conversation, resumed, gets what was pinned to it, once
        with claude_pane(w.project, w.env, "--resume", sid) as pane:
            wait_until(lambda: w.session(sid)["state"] == "idle", 60, "the resumed session", pane)
            req = turns_while(
                pane, api, w, sid, lambda: shown(api.model_requests()[-1], "MARK-CROSS") == 0, "OLD"
            )
            assert shown(req, "PROMPT-ONE") == 1
            assert shown(req, "MARK-HANDED") == 1
            assert shown(req, "MARK-CROSS: crossing") == 1
            assert shown(req, "MARK-DIRECT") == 0 and shown(req, "MARK-SEND") == 0
    assert w.copy(direct)["state"] == "acked"


def is_summary(req: dict[str, Any]) -> bool:
    """Claude Code's request for a summary of the conversation (``/compact``)."""
    return "summary" in last_user_text(req).lower() and "PROMPT-" not in last_user_text(req)


def test_compact_shows_neither_a_handed_over_message_again_nor_a_waiting_one_twice(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    """``/compact`` (Claude Code asks its summary agent for a summary, then
    ``SessionStart`` with source ``compact`` in the same session): what the last ``Stop``
    hook handed over is not handed over again after it, and a message waiting is shown
    once, with the next prompt (the summary agent's ``SubagentStop`` opens no turn)."""
    w = Worker(hub, proxy, tmp_path)
    working, go_on = threading.Event(), threading.Event()
    rules = [
        Rule(lambda r: "PROMPT-ONE" in last_user_text(r), busy_until(go_on, working, "Ok."), 1),
        Rule(is_summary, say("<summary>SUMMARY-TEXT: the user said hello.</summary>")),
    ]
    with FakeAnthropic(rules, fallback="Noted.") as api:
        w.env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(w.project, w.env) as pane:
            sid = first_session(w, pane)
            pane.type("PROMPT-ONE")
            wait_until(working.is_set, 60, "the turn's model request", pane)
            handed = _send(hub, w.tokens["lead"], "worker", "MARK-HANDED: by the stop hook")
            go_on.set()
            wait_until(lambda: asking(api, "MARK-HANDED"), 60, "the Stop answer", pane)
            wait_until(lambda: w.idle_after_stop(sid, 2), 60, "the continuation's end", pane)

            direct = _send(hub, w.tokens["lead"], "worker", "MARK-DIRECT: waiting")
            pane.type("/compact")
            wait_until(
                lambda: [r for r in api.model_requests() if is_summary(r)], 60, "the summary", pane
            )
            pane.wait_for("Compacted")
            # the summary is the history; the waiting message comes once after it
            req = turns_until(pane, api, w, sid, [direct], "AFTER")
            assert shown(req, "SUMMARY-TEXT") >= 1, texts(req)
            assert shown(req, "MARK-HANDED") == 0
            assert shown(req, "MARK-DIRECT: waiting") == 1
            assert shown(req, "you are 'worker'") == 1
            # the summary agent's stop opened no turn: the session was idle at its prompt
            # (the next prompt, or a channel push, brings what waits)
            events = _get(hub, w.tokens["worker"], f"/v1/sessions/{sid}/transcript")["events"]
            opened = [e["data"].get("opened_by") for e in events if e["kind"] == "turn_start"]
            assert "SubagentStop" not in opened, opened
            assert [e["text"] for e in events if e["kind"] == "agent_output"] == []
            for mid in (handed, direct):
                events = [h["event"] for h in w.copy(mid)["history"]]
                assert events.count("acked") == 1, events
        assert [s["session_id"] for s in w.sessions()] == [sid]


@pytest.mark.parametrize("route", ["stop", "prompt"])
def test_esc_mid_turn_neither_loses_nor_repeats_the_message_just_handed_over(
    hub: Server, proxy: RefusingProxy, tmp_path: Path, route: str
) -> None:
    """Esc while the model works on what a hook just handed over (a ``Stop`` answer's
    continuation, or a prompt's ``UserPromptSubmit`` context): the conversation shows
    the message exactly once. An interrupted continuation stays in the conversation; Esc
    before any answer to a prompt takes the prompt back with its context, and the message
    is handed over again by the next turn's ``Stop``."""
    w = Worker(hub, proxy, tmp_path)
    working, held = threading.Event(), threading.Event()
    go_on, release = threading.Event(), threading.Event()
    mark = f"MARK-{route.upper()}: handed over"
    rules = [
        Rule(lambda r: shown(r, mark) > 0, busy_until(release, held, "x"), 1),
        Rule(lambda r: "PROMPT-ONE" in last_user_text(r), busy_until(go_on, working, "Ok."), 1),
    ]
    with FakeAnthropic(rules, fallback="Noted.") as api:
        w.env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(w.project, w.env) as pane:
            sid = first_session(w, pane)
            if route == "prompt":
                mid = _send(hub, w.tokens["lead"], "worker", mark)
                pane.type("PROMPT-ONE")
            else:
                pane.type("PROMPT-ONE")
                wait_until(working.is_set, 60, "the turn's model request", pane)
                mid = _send(hub, w.tokens["lead"], "worker", mark)
                go_on.set()
            wait_until(held.is_set, 60, "the model working on the message", pane)
            pane.pane.send_keys("Escape", enter=False)
            # Esc before any answer puts the prompt back in the input (the turn is taken
            # back); after a continuation's start it says "Interrupted"
            wait_until(
                lambda: "Interrupted" in pane.screen() or _prompt_back(pane, "PROMPT-ONE"),
                60,
                "the interrupt",
                pane,
            )
            release.set()
            pane.pane.send_keys("C-u", enter=False)  # what is left in the input, gone
            req = prompt_turn(pane, api, w, "PROMPT-TWO", sid)
            if route == "stop":  # the interrupted continuation stays in the conversation
                assert shown(req, f"[From lead] {mark}") == 1, texts(req)
            wait_until(lambda: w.copy(mid)["state"] == "acked", 30, "the ack", pane)
            # taken back with its prompt, it comes again with the next turn's end
            later = prompt_turn(pane, api, w, "PROMPT-THREE", sid)
            assert shown(later, f"[From lead] {mark}") == 1, texts(later)
            leased = [h["event"] for h in w.copy(mid)["history"]].count("leased")
            assert leased == (1 if route == "stop" else 2)


def _prompt_back(pane: Pane, text: str) -> bool:
    """Whether ``text`` is in the input line again, nothing at work."""
    screen = pane.screen()
    lines = [line.replace("\xa0", " ") for line in screen.splitlines()]
    back = any(line.startswith(f"❯ {text}") for line in lines)
    return back and "esc to interrupt" not in screen


def test_two_windows_of_one_member_each_get_their_own_and_share_the_rest_once(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    """Two Claude Code windows in one project, as the same member, at once: two hub
    sessions; a message pinned to one session reaches that window only, and a message for
    the member reaches exactly one of them, once."""
    w = Worker(hub, proxy, tmp_path)
    with FakeAnthropic([], fallback="Noted.") as api:
        w.env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(w.project, w.env) as one, claude_pane(w.project, w.env) as two:
            pair = wait_until(lambda: len(w.live()) == 2 and w.live(), 60, "two sessions", one)
            sids = [s["session_id"] for s in pair]
            # which window is which session: the first prompt's turn says
            one.type("PROMPT-A")
            wait_until(lambda: asking(api, "PROMPT-A"), 60, "window one's request", one)
            first = wait_until(
                lambda: [s for s in sids if w.stops(s) == 1] or None, 60, "its turn's end", one
            )
            [sid_one] = first
            [sid_two] = [s for s in sids if s != sid_one]
            pins = {}
            with hub.client(w.tokens["lead"]) as c:
                for sid, mark in ((sid_one, "MARK-PIN-ONE"), (sid_two, "MARK-PIN-TWO")):
                    body = {"to": "worker", "text": mark, "session": sid}
                    r = c.post("/v1/messages", json=body)
                    r.raise_for_status()
                    pins[sid] = r.json()["message_id"]
            shared = _send(hub, w.tokens["lead"], "worker", "MARK-SHARED: either window")
            turns_until(one, api, w, sid_one, [pins[sid_one]], "ONE")
            turns_until(two, api, w, sid_two, [pins[sid_two]], "TWO")
            turns_until(one, api, w, sid_one, [shared], "MORE")
            last_one = prompt_turn(one, api, w, "PROMPT-END-ONE", sid_one)
            last_two = prompt_turn(two, api, w, "PROMPT-END-TWO", sid_two)
            assert shown(last_one, "MARK-PIN-ONE") == 1 and shown(last_one, "MARK-PIN-TWO") == 0
            assert shown(last_two, "MARK-PIN-TWO") == 1 and shown(last_two, "MARK-PIN-ONE") == 0
            # the member's message went to one window, once
            assert shown(last_one, "MARK-SHARED") + shown(last_two, "MARK-SHARED") == 1
            for mid in (shared, *pins.values()):
                events = [h["event"] for h in w.copy(mid)["history"]]
                assert events.count("acked") == 1, events


def after_tool_result(req: dict[str, Any]) -> bool:
    """Whether ``req``'s last user turn is a tool's result (the model goes on after it)."""
    msgs = [m for m in req.get("messages", []) if m.get("role") == "user"]
    content = msgs[-1].get("content") if msgs else None
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


def test_resuming_a_conversation_running_in_another_terminal_leaves_its_turn_and_sends_once(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    """``claude --resume <id>`` in a second terminal while the first still runs a turn of
    that conversation: the running turn is not closed as crashed, and its closing
    ``<message>`` block repeating what its ``send_message`` already sent goes out once."""
    w = Worker(hub, proxy, tmp_path)
    working, go_on = threading.Event(), threading.Event()
    body = "MARK-ONCE: the report is ready"
    rules = [
        Rule(
            lambda r: "PROMPT-SEND" in last_user_text(r) and not after_tool_result(r),
            call("mcp__backchannel__send_message", to="lead", message=body),
            1,
        ),
        Rule(
            lambda r: after_tool_result(r) and "PROMPT-SEND" in " ".join(texts(r)),
            busy_until(go_on, working, f'Done.\n<message to="lead">{body}</message>'),
            1,
        ),
    ]
    with FakeAnthropic(rules, fallback="Noted.") as api:
        w.env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(w.project, w.env) as one:
            sid = first_session(w, one)
            one.type("PROMPT-SEND")
            wait_until(working.is_set, 60, "the turn's last model request", one)
            sent = wait_until(lambda: w.session(sid)["state"] == "active", 30, "the turn", one)
            assert sent
            with claude_pane(w.project, w.env, "--resume", sid) as two:

                def started() -> bool:
                    events = _get(hub, w.tokens["worker"], f"/v1/sessions/{sid}/transcript")
                    return any(
                        (e["kind"] == "session" and "process" in e["text"])
                        or "recovered" in e["text"]
                        for e in events["events"]
                    )

                wait_until(started, 60, "the second terminal's SessionStart", two)
                go_on.set()
                wait_until(lambda: w.idle_after_stop(sid, 1), 60, "the first turn's end", one)
    got = _get(hub, w.tokens["lead"], "/v1/inbox", wait=0, limit=50)["messages"]
    assert [m["text"] for m in got if m["kind"] != "system"].count(body) == 1, got
    events = _get(hub, w.tokens["worker"], f"/v1/sessions/{sid}/transcript")["events"]
    assert not [e["text"] for e in events if "recovered" in e["text"]]


def test_killed_mid_continuation_and_resumed_the_handed_message_reaches_the_model_once(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    """Claude Code killed (``kill -9`` of its process group) while its model works on a
    message the ``Stop`` hook handed over, then ``claude --resume <id>``: the turn is
    recovered as crashed, and the message, which the killed process never wrote to the
    conversation, is in front of the resumed conversation's model exactly once."""
    w = Worker(hub, proxy, tmp_path)
    working, go_on = threading.Event(), threading.Event()
    held, never = threading.Event(), threading.Event()
    rules = [
        Rule(lambda r: "PROMPT-ONE" in last_user_text(r), busy_until(go_on, working, "Ok."), 1),
        Rule(lambda r: "MARK-HANDED" in last_user_text(r), busy_until(never, held, "Late."), 1),
    ]
    try:
        with FakeAnthropic(rules, fallback="Noted.") as api:
            w.env["ANTHROPIC_BASE_URL"] = api.url
            with claude_pane(w.project, w.env) as pane:
                sid = first_session(w, pane)
                pane.type("PROMPT-ONE")
                wait_until(working.is_set, 60, "the turn's model request", pane)
                handed = _send(hub, w.tokens["lead"], "worker", "MARK-HANDED: by the stop hook")
                go_on.set()
                wait_until(held.is_set, 60, "the continuation's model request", pane)
                leader = int(pane.pane.cmd("display-message", "-p", "#{pane_pid}").stdout[0])
                os.killpg(leader, signal.SIGKILL)
                wait_until(pane.exited, 30, "Claude Code killed", pane)
            with claude_pane(w.project, w.env, "--resume", sid) as pane:
                wait_until(
                    lambda: w.session(sid)["state"] == "idle", 60, "the recovered turn", pane
                )
                turns_until(pane, api, w, sid, [handed], "BACK")
                last = prompt_turn(pane, api, w, "PROMPT-LAST", sid)
                assert shown(last, "MARK-HANDED: by the stop hook") == 1, texts(last)
                assert shown(last, "PROMPT-ONE") == 1
    finally:
        never.set()
    events = [h["event"] for h in w.copy(handed)["history"]]
    assert events.count("acked") == 1, events
