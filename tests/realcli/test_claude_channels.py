"""The real Claude Code CLI (pinned, from npm) in a tmux pane, attached to a real
``backchannel serve``, its model a scripted API on 127.0.0.1: a teammate's message pushed
through the channel starts a turn in an idle session, is shown once, two turns so woken
that end with the same words each cross a link once, and without channels the Stop route
still delivers."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, Server, start_server
from tests.realcli.fake_anthropic import FakeAnthropic, Rule, last_user_text, say, texts
from tests.realcli.harness import mcp_runtime
from tests.realcli.tmux_harness import (
    RefusingProxy,
    claude_pane,
    cli_env,
    wait_until,
    write_home,
)

pytestmark = [pytest.mark.realcli, pytest.mark.slow, pytest.mark.timeout(240)]

#: What Claude Code 2.1.330 itself tries to reach when its feature flags are on (as
#: channels need): its flag and metrics service and a file on GitHub. The proxy refuses
#: them; nothing of ours is among them.
CLI_OWN_SERVICES = {"api.anthropic.com:443", "raw.githubusercontent.com:443"}
#: Turns off Claude Code's own background traffic; channels need its feature flags, so
#: the channel tests keep the flag service (refused by the proxy) and set the rest.
QUIET = {
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
}
NO_TRAFFIC = {**QUIET, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
#: Channels are behind a feature flag; a first run reads it from this cache in
#: ~/.claude.json until the flag service answers (here it never does).
CHANNEL_FLAGS = {
    "cachedGrowthBookFeatures": {"tengu_harbor": True},
    "cachedFeatureFlags": {"tengu_harbor": True},
}
DEV_CHANNEL = ("--dangerously-load-development-channels", "server:backchannel")


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "hub")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def proxy() -> Iterator[RefusingProxy]:
    p = RefusingProxy()
    try:
        yield p
    finally:
        p.close()


def _team(hub: Server, **settings: Any) -> dict[str, str]:
    tokens = {}
    with hub.client() as c:
        body = {"name": "demo", **({"settings": settings} if settings else {})}
        c.post("/v1/teams", json=body).raise_for_status()
        for name in ("lead", "worker"):
            r = c.post("/v1/teams/demo/members", json={"name": name, "kind": "claude-code"})
            r.raise_for_status()
            tokens[name] = r.json()["token"]
    return tokens


def _attach(hub: Server, project: Path) -> None:
    project.mkdir(parents=True)
    args = ["claude-code", "--team", "demo", "--member", "worker", "--dir", str(project)]
    subprocess.run(
        [str(BIN), "attach", *args, "--url", hub.url],
        check=True,
        capture_output=True,
        env={**os.environ, "BACKCHANNEL_HOME": str(hub.home)},
    )


def _home(tmp_path: Path, project: Path, flags: bool) -> Path:
    home = tmp_path / "home"
    write_home(home, [project])
    if flags:
        config = json.loads((home / ".claude.json").read_text())
        (home / ".claude.json").write_text(json.dumps({**config, **CHANNEL_FLAGS}))
    return home


def _get(hub: Server, token: str, path: str, **params: Any) -> Any:
    with hub.client(token) as c:
        r = c.get(path, params=params)
        r.raise_for_status()
        return r.json()


def _send(hub: Server, token: str, to: str, text: str) -> str:
    with hub.client(token) as c:
        r = c.post("/v1/messages", json={"to": to, "text": text})
        r.raise_for_status()
        return str(r.json()["message_id"])


def _session(hub: Server, token: str) -> dict[str, Any] | None:
    found = _get(hub, token, "/v1/sessions", member="worker")["sessions"]
    live = [s for s in found if s["state"] != "terminated"]
    return live[0] if live else None


def _copy(hub: Server, token: str, message_id: str) -> dict[str, Any]:
    status = _get(hub, token, f"/v1/messages/{message_id}")
    return {**status["deliveries"][0], "history": status.get("history", [])}


def _asking(api: FakeAnthropic, mark: str) -> list[dict[str, Any]]:
    return [r for r in api.model_requests() if mark in last_user_text(r)]


def _shown(req: dict[str, Any], mark: str) -> int:
    """How often ``mark`` is in what the model is shown by ``req`` (its whole history)."""
    return sum(t.count(mark) for t in texts({"messages": req.get("messages", [])}))


def test_idle_session_is_woken_by_a_channel_push_and_shown_it_once(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    tokens = _team(hub)
    project = tmp_path / "worker"
    _attach(hub, project)
    env = cli_env(_home(tmp_path, project, flags=True), "", proxy, **QUIET)
    env["BACKCHANNEL_TOKEN"] = tokens["worker"]
    with FakeAnthropic([], fallback="Noted.") as api:
        env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(project, env, *DEV_CHANNEL) as pane:
            pane.wait_for("I am using this for local development")
            pane.enter()
            session = wait_until(lambda: _session(hub, tokens["worker"]), 60, "the session")
            assert session["state"] == "idle" and session["turn"] == 0
            # idle at its prompt, the session is vouched for by Claude Code's MCP server:
            # the process it runs under is the one the hooks named for the session
            with hub.client(tokens["worker"]) as c:
                beat = c.post("/v1/sessions/alive", json={"runtime": mcp_runtime("demo", "worker")})
            assert beat.json()["sessions"] == [session["session_id"]], beat.text

            # nothing typed: the push alone starts a turn that carries the message
            sent_at = time.monotonic()
            first = _send(hub, tokens["lead"], "worker", "MARK-ONE: count the lines in src/")
            (req,) = wait_until(lambda: _asking(api, "MARK-ONE"), 60, "a request with it", pane)
            woke_in = time.monotonic() - sent_at
            shown = last_user_text(req)
            assert f'<channel source="backchannel" message_id="{first}"' in shown
            assert "[From lead] MARK-ONE: count the lines in src/" in shown
            pane.wait_for("← backchannel: [From lead] MARK-ONE")

            # acked by the hook of the turn it started, on its first and only lease
            wait_until(
                lambda: _copy(hub, tokens["worker"], first)["state"] == "acked", 30, "the ack"
            )
            assert _copy(hub, tokens["worker"], first)["attempts"] == 1

            # the turn ends; the Stop route does not hand it over again: the next
            # message's turn shows the first one once, in the whole conversation
            wait_until(
                lambda: (_session(hub, tokens["worker"]) or {}).get("last_stop_at"),
                60,
                "the turn's end",
            )
            sent_at = time.monotonic()
            second = _send(hub, tokens["lead"], "worker", "MARK-TWO: and the tests?")
            (later,) = wait_until(lambda: _asking(api, "MARK-TWO"), 60, "the second", pane)
            woke_again_in = time.monotonic() - sent_at
            assert _shown(later, "MARK-ONE") == 1
            assert f'message_id="{second}"' in last_user_text(later)
            sid = session["session_id"]
            events = _get(hub, tokens["worker"], f"/v1/sessions/{sid}/transcript")["events"]
            starts = [e for e in events if e["kind"] == "turn_start"]
            assert [e["data"].get("hook") for e in starts] == ["UserPromptSubmit"] * 2
            assert not [e for e in starts if e["data"].get("continued_by")]
    print(f"\nchannel push to model request: {woke_in:.2f} s just after start (the MCP")
    print(f"server still connecting), {woke_again_in:.2f} s when idle after a turn")
    assert {a.split()[1] for a in proxy.attempts} <= CLI_OWN_SERVICES, proxy.attempts


def test_after_clear_a_channel_push_wakes_the_new_conversation(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    """``/clear`` gives the conversation a new session id, but the MCP server keeps the
    ``CLAUDE_CODE_SESSION_ID`` it was started with: it pushed only into the old session,
    exited, until that ended an exit grace later. It pushes into the session its beat
    names (at most a beat later: a third of this team's 120 s grace), well before."""
    tokens = _team(hub, exit_grace_seconds=120)
    project = tmp_path / "worker"
    _attach(hub, project)
    env = cli_env(_home(tmp_path, project, flags=True), "", proxy, **QUIET)
    env["BACKCHANNEL_TOKEN"] = tokens["worker"]
    with FakeAnthropic([], fallback="Noted.") as api:
        env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(project, env, *DEV_CHANNEL) as pane:
            pane.wait_for("I am using this for local development")
            pane.enter()
            old = wait_until(lambda: _session(hub, tokens["worker"]), 60, "the session")
            pane.type("/clear")

            def fresh() -> dict[str, Any] | None:
                live = _get(hub, tokens["worker"], "/v1/sessions", member="worker")["sessions"]
                new = [s for s in live if s["session_id"] != old["session_id"]]
                return new[0] if new and new[0]["state"] == "idle" else None

            new = wait_until(fresh, 60, "the new conversation's session", pane)
            mid = _send(hub, tokens["lead"], "worker", "MARK-AFTER-CLEAR: wake up")
            # nothing typed: a push alone starts the new conversation's turn
            (req,) = wait_until(lambda: _asking(api, "MARK-AFTER-CLEAR"), 80, "the push", pane)
            assert f'<channel source="backchannel" message_id="{mid}"' in last_user_text(req)
            wait_until(lambda: _copy(hub, tokens["worker"], mid)["state"] == "acked", 30, "ack")
            sid = new["session_id"]
            events = _get(hub, tokens["worker"], f"/v1/sessions/{sid}/transcript")["events"]
            assert any(e["kind"] == "turn_start" for e in events)
            state = _get(hub, tokens["worker"], f"/v1/sessions/{old['session_id']}")["state"]
            assert state == "exited"  # the push came before the old session's end


def test_without_channels_the_stop_route_still_delivers(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    tokens = _team(hub)
    project = tmp_path / "worker"
    _attach(hub, project)
    env = cli_env(_home(tmp_path, project, flags=False), "", proxy, **NO_TRAFFIC)
    env["BACKCHANNEL_TOKEN"] = tokens["worker"]
    working, go_on = threading.Event(), threading.Event()

    def busy(req: dict[str, Any]) -> Any:
        working.set()
        go_on.wait(60)  # the turn runs until the test has sent its message
        return say("Task done.")

    rules = [Rule(lambda r: "START-TASK" in last_user_text(r), busy, times=1)]
    with FakeAnthropic(rules, fallback="Noted.") as api:
        env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(project, env) as pane:
            wait_until(lambda: _session(hub, tokens["worker"]), 60, "the session", pane)
            pane.type("START-TASK")
            wait_until(working.is_set, 60, "the turn's model request", pane)
            wait_until(
                lambda: (_session(hub, tokens["worker"]) or {}).get("state") == "active",
                30,
                "the open turn",
            )
            mid = _send(hub, tokens["lead"], "worker", "MARK-STOP: the build is red")
            go_on.set()
            (req,) = wait_until(lambda: _asking(api, "MARK-STOP"), 60, "the Stop answer", pane)
            assert "[From lead] MARK-STOP: the build is red" in last_user_text(req)
            assert "<channel" not in last_user_text(req)
            wait_until(lambda: _copy(hub, tokens["worker"], mid)["state"] == "acked", 30, "ack")
            # leased for the Stop answer, acked by the continuation's next hook event
            events = [h["event"] for h in _copy(hub, tokens["worker"], mid)["history"]]
            assert events.count("leased") == events.count("acked") == 1, events
            # shown as the hook's plain feedback, not as a problem
            screen = pane.wait_for("Stop hook says: backchannel: 1 message arrived")
            assert "reported a problem" not in screen and "stop hook problem" not in screen
    assert proxy.attempts == []


def _hub_turn(hub: Server, token: str, sid: str, closing: str, send: str | None = None) -> None:
    """lead, a hub-side agent on session ``sid``, takes a turn: it sends ``send`` to
    worker (which opens a link), and ends with ``closing`` (which crosses a link open)."""
    with hub.client(token) as c:
        c.post("/v1/sessions", json={"session_id": sid}).raise_for_status()
        c.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start", "text": ""})
        if send is not None:
            body = {"to": "worker", "text": send, "from_session": sid}
            c.post("/v1/messages", json=body).raise_for_status()
        c.post(f"/v1/sessions/{sid}/events", json={"kind": "agent_stop", "text": closing})


def _crossings(hub: Server, token: str, sid: str, got: list[str]) -> list[str]:
    """What of worker's reached lead's session ``sid`` so far (``got``, added to and
    acknowledged as it comes)."""
    with hub.client(token) as c:
        found = c.get("/v1/inbox", params={"session": sid, "limit": 100}).json()["messages"]
        if found:
            ids = [m["message_id"] for m in found]
            c.post("/v1/inbox/ack", json={"message_ids": ids}).raise_for_status()
    got += [m["text"] for m in found if m["kind"] != "system" and m["from"] == "worker"]
    return got


def _stop_summaries(home: Path, sid: str) -> int:
    """How many turns Claude Code has ended with its Stop hooks run (its transcript's
    ``stop_hook_summary`` entries)."""
    found = 0
    for transcript in (home / ".claude" / "projects").rglob(f"{sid}.jsonl"):
        for line in transcript.read_text().splitlines():
            found += json.loads(line).get("subtype") == "stop_hook_summary"
    return found


def test_two_channel_woken_turns_ending_alike_each_cross_the_link_once(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    """An idle interactive session woken twice by channel pushes, each turn ending with
    the same words ("Done."), linked to a peer: both turns cross to the peer, neither
    twice. Each stop is named by the uuid of its turn's last assistant message, which
    ``backchannel hook`` reads from the transcript of a turn no typed prompt started."""
    tokens = _team(hub)
    project = tmp_path / "worker"
    _attach(hub, project)
    home = _home(tmp_path, project, flags=True)
    env = cli_env(home, "", proxy, **QUIET)
    env["BACKCHANNEL_TOKEN"] = tokens["worker"]
    crossed: list[str] = []
    with FakeAnthropic([], fallback="Done.") as api:
        env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(project, env, *DEV_CHANNEL) as pane:
            pane.wait_for("I am using this for local development")
            pane.enter()
            session = wait_until(lambda: _session(hub, tokens["worker"]), 60, "the session")
            sid = session["session_id"]

            # lead's send from its turn opens the link, and the push wakes the session
            _hub_turn(hub, tokens["lead"], "lead-s", "", send="MARK-ONE: count the lines")
            wait_until(lambda: _asking(api, "MARK-ONE"), 60, "the first turn", pane)
            wait_until(
                lambda: _crossings(hub, tokens["lead"], "lead-s", crossed), 60, "a crossing", pane
            )
            assert crossed == ["[From worker] Done."]

            # lead's answer crosses back, is pushed, and wakes the idle session again
            _hub_turn(hub, tokens["lead"], "lead-s", "MARK-TWO: and the tests?")
            wait_until(lambda: _asking(api, "MARK-TWO"), 60, "the second turn", pane)
            wait_until(
                lambda: len(_crossings(hub, tokens["lead"], "lead-s", crossed)) > 1,
                60,
                "the second turn's crossing",
                pane,
            )
            # both turns ended with their Stop hooks run (each reported once or more):
            # nothing more is on its way
            wait_until(lambda: _stop_summaries(home, sid) >= 2, 60, "both turns' end", pane)
            assert _crossings(hub, tokens["lead"], "lead-s", crossed) == ["[From worker] Done."] * 2

            events = _get(hub, tokens["worker"], f"/v1/sessions/{sid}/transcript")["events"]
            stops = [e for e in events if e["kind"] == "agent_stop"]
            marks = [(e.get("data") or {}).get("last_stop") or {} for e in stops]
            ids = [m.get("id") for m in marks]
            assert len(ids) == 2 and all(ids) and ids[0] != ids[1], marks
    assert {a.split()[1] for a in proxy.attempts} <= CLI_OWN_SERVICES, proxy.attempts


def test_a_long_message_pushed_through_the_channel_reaches_the_model_whole_once(
    hub: Server, proxy: RefusingProxy, tmp_path: Path
) -> None:
    """A message near the hub's size limit pushed into an idle session: Claude Code shows
    the model all of it, once, in the turn the push starts, and the hook of that turn
    acks it (nothing cut on the way, nothing handed over again by the Stop route)."""
    tokens = _team(hub)
    project = tmp_path / "worker"
    _attach(hub, project)
    env = cli_env(_home(tmp_path, project, flags=True), "", proxy, **QUIET)
    env["BACKCHANNEL_TOKEN"] = tokens["worker"]
    lines = [
        f"row {n:05d}: the quick brown fox é 漢字 jumps over the lazy dog" for n in range(3000)
    ]
    text = "LONG-START\n" + "\n".join(lines) + "\nLONG-END"
    assert 150_000 < len(text.encode("utf-8")) < 256 * 1024
    with FakeAnthropic([], fallback="Noted.") as api:
        env["ANTHROPIC_BASE_URL"] = api.url
        with claude_pane(project, env, *DEV_CHANNEL) as pane:
            pane.wait_for("I am using this for local development")
            pane.enter()
            wait_until(lambda: _session(hub, tokens["worker"]), 60, "the session")
            sent = _send(hub, tokens["lead"], "worker", text)
            (req,) = wait_until(lambda: _asking(api, "LONG-START"), 60, "the push's turn", pane)
            shown = last_user_text(req)
            assert f'message_id="{sent}"' in shown
            assert f"[From lead] {text}" in shown, "the message reached the model cut"
            assert _shown(req, "LONG-START") == 1 and _shown(req, "row 02999") == 1
            wait_until(lambda: _copy(hub, tokens["worker"], sent)["state"] == "acked", 30, "ack")
            assert _copy(hub, tokens["worker"], sent)["attempts"] == 1
            wait_until(
                lambda: (_session(hub, tokens["worker"]) or {}).get("last_stop_at"),
                60,
                "the turn's end",
            )
            after = _send(hub, tokens["lead"], "worker", "MARK-AFTER: anything else?")
            (later,) = wait_until(lambda: _asking(api, "MARK-AFTER"), 60, "the next push", pane)
            assert _shown(later, "LONG-START") == 1, "the long message was shown twice"
            assert f'message_id="{after}"' in last_user_text(later)
    assert {a.split()[1] for a in proxy.attempts} <= CLI_OWN_SERVICES, proxy.attempts
