"""Hooks against a real ``backchannel serve``: the command hook, ``POST /v1/hooks/...``,
and two agents (Claude Code and Gemini CLI) talking entirely through hook calls and MCP
tool calls."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from tests.conftest import Server, start_server

from .agents import hook_cmd, hook_http, http_mcp, make_team, text
from .helpers import FIXTURES, fixture


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("hooks") / "home")
    try:
        yield s
    finally:
        s.stop()


def _env(srv: Server, token: str) -> dict[str, str]:
    return {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": token}


def _answer(run: Any) -> dict[str, Any]:
    assert run.returncode == 0, run.stderr
    answer: dict[str, Any] = json.loads(run.stdout)
    return answer


def _texts(srv: Server, token: str) -> list[str]:
    with srv.client(token) as c:
        got = c.get("/v1/inbox", params={"limit": 100}).json()["messages"]
        if got:
            c.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got]})
    return [m["text"] for m in got]


async def test_two_agents_talk_through_hooks_and_mcp_tools(srv: Server) -> None:
    tokens = make_team(srv, "ex", "lead:claude-code", "worker:gemini", anchor_policy="enforce")
    lead_env = _env(srv, tokens["lead"])
    ls, ws = "lead-session-1", "worker-session-1"

    def lead(name: str, **changes: Any) -> dict[str, Any]:
        payload = json.dumps(fixture("claude-code", name, session_id=ls, **changes))
        return _answer(hook_cmd("claude-code", payload, "--as", "ex/lead", env=lead_env))

    def worker(name: str, **changes: Any) -> dict[str, Any]:
        return hook_http(
            srv, tokens["worker"], "gemini", fixture("gemini", name, session_id=ws, **changes)
        )

    start = lead("SessionStart")
    assert "you are 'lead' in team 'ex'" in start["hookSpecificOutput"]["additionalContext"]
    assert worker("SessionStart")["hookSpecificOutput"]["hookEventName"] == "SessionStart"

    # the lead's user asks for a line count; the lead asks the worker through its tools
    assert lead("UserPromptSubmit", prompt="Get the line count of src/ from worker.") == {}
    async with http_mcp(srv.url, tokens["lead"]) as mcp:
        sent = await mcp.call_tool("send_message", {"to": "worker", "message": "count src/"})
        assert not sent.is_error, text(sent)
    assert lead("PostToolUse", tool_name="mcp__backchannel__send_message") == {}

    # the worker's next prompt carries the message; it works and finishes its turn
    prompt = worker("BeforeAgent", prompt="Check what the team needs.")
    assert "[From lead] count src/" in prompt["hookSpecificOutput"]["additionalContext"]
    assert worker("BeforeTool") == {} and worker("AfterTool") == {}
    async with http_mcp(srv.url, tokens["worker"]) as mcp:
        members = text(await mcp.call_tool("list_members", {}))
        assert f"lead, claude-code; sessions: {ls} (active)" in members
        peek = text(await mcp.call_tool("get_session_data", {"session": "lead"}))
        assert "sent: count src/" in peek
    assert worker("AfterAgent", prompt_response="src/ holds 420 lines.") == {}

    # the worker's finished turn reaches the lead as its Stop hook's answer
    stop = lead("Stop", last_assistant_message="Asked the worker; waiting for it.")
    assert stop["decision"] == "block"
    assert "[From worker] src/ holds 420 lines." in stop["reason"]

    # the lead goes on: closing the link needs an anchor timer first (policy: enforce)
    async with http_mcp(srv.url, tokens["lead"]) as mcp:
        thanks = {"to": "worker", "message": "thanks, that's all", "close_link": True}
        refused = await mcp.call_tool("send_message", thanks)
        assert refused.is_error and "anchor" in text(refused)
        timer = await mcp.call_tool(
            "set_timer", {"intent": "anchor", "minutes": 30, "note": "write the report"}
        )
        assert not timer.is_error, text(timer)
        closed = await mcp.call_tool("send_message", thanks)
        assert "link with them is now closed" in text(closed)
    # nothing new from anyone: the continuation stops for good (no loop)
    assert lead("Stop", stop_hook_active=True, last_assistant_message="Report written.") == {}

    later = worker("BeforeAgent", prompt="Anything else?")
    context = later["hookSpecificOutput"]["additionalContext"]
    assert "[From lead] Asked the worker; waiting for it." in context
    assert "[From lead] thanks, that's all" in context
    assert worker("AfterAgent", prompt_response="Nothing else.", stop_hook_active=False) == {}
    assert lead("SessionEnd") == {} and worker("SessionEnd") == {}

    with srv.client(tokens["lead"]) as c:
        [link] = c.get("/v1/links").json()["links"]
        assert (link["state"], link["close_reason"]) == ("closed", "closed_by_initiator")
        states = {s["session_id"]: s["state"] for s in c.get("/v1/sessions").json()["sessions"]}
    assert states == {ls: "exited", ws: "exited"}  # resumable for the team's exit grace


# -- the command hook --------------------------------------------------------------------------


def test_command_hook_bad_input_never_blocks_the_agent(srv: Server) -> None:
    tokens = make_team(srv, "bad", "w:claude-code", "other")
    env = _env(srv, tokens["w"])
    stop = json.dumps(fixture("claude-code", "Stop"))
    cases = [
        (hook_cmd("claude-code", "{not json", env=env), "not JSON"),
        (hook_cmd("claude-code", '{"hook_event_name": "Stop"}', env=env), "missing field"),
        (hook_cmd("claude-code", stop, env={"BACKCHANNEL_URL": srv.url}), "BACKCHANNEL_TOKEN"),
        (hook_cmd("claude-code", stop, "--as", "bad/other", env=env), "belongs to bad/w"),
        (hook_cmd("cursor", stop, env=env), "unknown runtime 'cursor'"),
        (hook_cmd("claude-code", stop, env=_env(srv, "bc_nope")), "invalid token"),
        (
            hook_cmd("claude-code", stop, env={**env, "BACKCHANNEL_URL": "http://127.0.0.1:9"}),
            "cannot reach the hub",
        ),
    ]
    for run, reason in cases:
        assert (run.returncode, run.stdout.strip()) == (0, "{}"), run.stderr
        assert reason in run.stderr
    log = (srv.home / "serve.log").read_text()
    assert "hook claude-code from bad/w had no effect" in log and "not JSON" in log
    with srv.client(tokens["w"]) as c:
        assert c.get("/v1/sessions").json()["sessions"] == []


def test_command_hook_reads_the_transcript_and_takes_codex_notify(
    srv: Server, tmp_path: Path
) -> None:
    tokens = make_team(srv, "cmd", "w:claude-code", "lead", "cx:codex")
    config = tmp_path / "claude-config"  # CLAUDE_CONFIG_DIR: transcripts under projects/
    transcript = config / "projects" / "-home-dev-proj" / "session.jsonl"
    transcript.parent.mkdir(parents=True)
    transcript.write_text((FIXTURES / "claude-code" / "transcript.jsonl").read_text())
    payload = fixture("claude-code", "Stop-without-last-message", transcript_path=str(transcript))
    env = {**_env(srv, tokens["w"]), "CLAUDE_CONFIG_DIR": str(config)}
    run = hook_cmd("claude-code", json.dumps(payload), env=env)
    assert (_answer(run), run.stderr) == ({}, "")
    assert _texts(srv, tokens["lead"]) == ["420 lines in src/"]
    # Codex's notify program gets the JSON as its last argument and stdin is empty
    notify = json.dumps(fixture("codex", "notify"))
    run = hook_cmd("codex", "", notify, env=_env(srv, tokens["cx"]))
    assert (_answer(run), run.stderr) == ({}, "")
    assert _texts(srv, tokens["lead"]) == ["foo is now bar"]


def test_command_hook_in_process_on_the_data_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()

    async def setup() -> str:
        async with Hub(SqliteStore(home / "backchannel.db")) as hub:
            await hub.create_team("solo")
            return (await hub.add_member("solo", "w", "gemini"))[1]

    token = asyncio.run(setup())
    env = {"BACKCHANNEL_HOME": str(home), "BACKCHANNEL_TOKEN": token}
    run = hook_cmd("gemini", json.dumps(fixture("gemini", "SessionStart")), env=env)
    assert "you are 'w' in team 'solo'" in _answer(run)["hookSpecificOutput"]["additionalContext"]
    run = hook_cmd("gemini", "[]", env=env)
    assert (_answer(run), "must be a JSON object" in run.stderr) == ({}, True)


def test_the_hook_endpoint(srv: Server) -> None:
    tokens = make_team(srv, "ep", "w:codex")
    stop = fixture("codex", "Stop")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/v1/hooks/codex", json=stop)
        assert r.status_code == 401
        auth = {"Authorization": f"Bearer {tokens['w']}"}
        r = c.post("/v1/hooks/cursor", json=stop, headers=auth)
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_request")
        r = c.post("/v1/hooks/codex", content=b"\xff", headers=auth)
        assert (r.status_code, r.json()) == (200, {})
        assert "not JSON" in r.headers["backchannel-hook-problem"]
        r = c.post("/v1/hooks/codex", json=stop, headers=auth, params={"as": "ep/someone"})
        assert (r.json(), "belongs to ep/w" in r.headers["backchannel-hook-problem"]) == ({}, True)
        r = c.post("/v1/hooks/codex", json=stop, headers=auth)
        assert (r.status_code, r.json(), "backchannel-hook-problem" in r.headers) == (
            200,
            {},
            False,
        )
