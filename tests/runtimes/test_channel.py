"""Claude Code channels against an in-process hub: the MCP server pushes a waiting
message into an idle session, the session's next hook event acks what it shows, a copy
it has shown is never handed over again, and a client that does not listen gets its
messages back at once for the hook routes. The real CLI: tests/realcli."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from backchannel.client import Client
from backchannel.hub import Hub
from backchannel.interfaces.mcp_channel import ChannelPusher
from backchannel.interfaces.mcp_front import Front
from backchannel.runtimes import get_runtime
from backchannel.runtimes.channel_tags import channel_ids, cli_version
from backchannel.runtimes.transcripts import enrich
from backchannel.testing import MemoryStore, eventually

from .helpers import PROMPT_EVENT, STOP_EVENT, call, fixture, session_of

SID = session_of("claude-code")


@pytest.fixture
async def live_hub() -> Any:
    """A hub on the real clock: the pusher waits on it in real time."""
    h = Hub(MemoryStore(), lease_seconds=30, max_attempts=5)
    async with h:
        await h.create_team("t", settings={"anchor_policy": "off"})
        _TOKENS[id(h)] = (await h.add_member("t", "w", "claude-code"))[1]
        await h.add_member("t", "lead")
        yield h


def _tag(message_id: str, sender: str = "lead") -> str:
    return f'<channel source="backchannel" message_id="{message_id}" from="{sender}" kind="direct">'


async def _state(hub: Hub, mid: str) -> tuple[str, int]:
    status = (await hub.message_status("t", mid)).to_json()["deliveries"][0]
    return str(status["state"]), int(status["attempts"])


async def _pusher(hub: Hub, pushed: list[tuple[str, dict[str, str]]], **kw: Any) -> ChannelPusher:
    client = Client.local(hub, _token(hub))
    await client.start()

    async def push(content: str, meta: dict[str, str]) -> None:
        pushed.append((content, meta))

    return ChannelPusher(client, "w", push, poll_s=0.02, settle_s=0.05, **kw)


_TOKENS: dict[int, str] = {}


def _token(hub: Hub) -> str:
    return _TOKENS[id(hub)]


@pytest.fixture
async def ready(live_hub: Hub) -> Hub:
    await call(live_hub, "t", "w", "claude-code", fixture("claude-code", "SessionStart"))
    return live_hub


# -- the tag and the payload -----------------------------------------------------------


def test_channel_ids_read_prompts_and_json_escaped_transcripts() -> None:
    prompt = f"{_tag('msg_1')}\n[From lead] hi\n</channel>"
    line = json.dumps({"message": {"content": [{"type": "text", "text": _tag("m.2:x")}]}})
    assert channel_ids(prompt, line) == ["msg_1", "m.2:x"]
    other = '<channel source="elsewhere" message_id="nope">'
    assert channel_ids(other, 'message_id="x"') == []


def test_enrich_adds_the_version_and_what_the_transcript_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path))  # transcripts are read only there
    transcript = tmp_path / "projects" / "p" / "t.jsonl"
    transcript.parent.mkdir(parents=True)
    entry = {"type": "user", "message": {"role": "user", "content": _tag("msg_9")}}
    transcript.write_text(json.dumps(entry) + "\n")
    monkeypatch.setenv("AI_AGENT", "claude-code_2-1-330_harness")
    assert cli_version() == "2.1.330"
    stop = fixture("claude-code", STOP_EVENT["claude-code"], transcript_path=str(transcript))
    got, _ = enrich("claude-code", stop)
    assert got["backchannel_seen"] == ["msg_9"]
    assert got["backchannel_cli_version"] == "2.1.330"
    monkeypatch.setenv("AI_AGENT", "something-else")
    assert cli_version() is None


# -- acks and copies -------------------------------------------------------------------


async def test_a_prompt_showing_a_push_acks_it(ready: Hub) -> None:
    r = await ready.send("t", "lead", "w", "the push")
    got = await ready.receive("t", "w", session=SID)  # the pusher's lease
    assert [g.message.message_id for g in got] == [r.message_id]
    prompt = f"{_tag(r.message_id)}\n[From lead] the push\n</channel>"
    res = await call(
        ready,
        "t",
        "w",
        "claude-code",
        fixture("claude-code", PROMPT_EVENT["claude-code"], prompt=prompt),
    )
    assert res.answer == {}  # nothing else waited: no second copy as context
    assert await _state(ready, r.message_id) == ("acked", 1)


async def test_the_stop_route_drops_a_copy_the_session_has_shown(ready: Hub) -> None:
    await call(ready, "t", "w", "claude-code", fixture("claude-code", PROMPT_EVENT["claude-code"]))
    shown = await ready.send("t", "lead", "w", "already shown")
    other = await ready.send("t", "lead", "w", "not yet shown")
    stop = fixture("claude-code", STOP_EVENT["claude-code"], backchannel_seen=[shown.message_id])
    res = await call(ready, "t", "w", "claude-code", stop)
    reason = res.answer["reason"]
    assert "not yet shown" in reason and "already shown" not in reason
    assert await _state(ready, shown.message_id) == ("acked", 1)
    assert await _state(ready, other.message_id) == ("leased", 1)  # until the next event
    await call(ready, "t", "w", "claude-code", fixture("claude-code", "PreToolUse"))
    assert await _state(ready, other.message_id) == ("acked", 1)


def test_stop_answers_as_feedback_where_the_version_takes_it() -> None:
    from backchannel.runtimes.common import Outcome

    rt = get_runtime("claude-code")
    outcome = Outcome(continue_with="[From lead] hi")
    new = rt.parse(fixture("claude-code", "Stop", backchannel_cli_version="2.1.330"))
    assert rt.render(new, outcome) == {
        "hookSpecificOutput": {"hookEventName": "Stop", "additionalContext": "[From lead] hi"}
    }
    for old in ({"backchannel_cli_version": "2.1.80"}, {}):
        event = rt.parse(fixture("claude-code", "Stop", **old))
        assert rt.render(event, outcome) == {"decision": "block", "reason": "[From lead] hi"}


# -- the pusher ------------------------------------------------------------------------


async def test_the_pusher_pushes_into_the_idle_session_and_goes_live_on_the_ack(
    ready: Hub,
) -> None:
    pushed: list[tuple[str, dict[str, str]]] = []
    pusher = await _pusher(ready, pushed, confirm_s=10)
    task = asyncio.create_task(pusher.run())
    try:
        r = await ready.send("t", "lead", "w", "wake up", summary="ping")
        await eventually(lambda: pushed, what="a push")
        content, meta = pushed[0]
        assert content == "[From lead] wake up"
        assert meta == {
            "message_id": r.message_id,
            "from": "lead",
            "kind": "direct",
            "summary": "ping",
        }
        assert (await _state(ready, r.message_id))[0] == "leased"
        # Claude Code starts a turn with it: its UserPromptSubmit shows the tag
        prompt = f"{_tag(r.message_id)}\n{content}\n</channel>"
        await call(
            ready,
            "t",
            "w",
            "claude-code",
            fixture("claude-code", PROMPT_EVENT["claude-code"], prompt=prompt),
        )
        await eventually(lambda: pusher.live, what="the pusher live")
        assert await _state(ready, r.message_id) == ("acked", 1)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_after_clear_the_pusher_pushes_into_the_new_conversation(
    live_hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/clear`` moves Claude Code to a new session id, but its MCP server keeps the
    ``CLAUDE_CODE_SESSION_ID`` it was started with, the old one: the pusher went on
    looking at the old conversation's session, exited, and pushed nothing into the new
    conversation until that session ended an exit grace later (an hour by default). The
    beat names the sessions that run under the server's runtime process: the new one."""
    key = {"backchannel_runtime": "boot/4242/1000"}  # the one Claude Code process
    monkeypatch.setenv("CLAUDE_CODE_SESSION_ID", SID)
    start = fixture("claude-code", "SessionStart", **key)
    await call(live_hub, "t", "w", "claude-code", start)
    pushed: list[tuple[str, dict[str, str]]] = []
    pusher = await _pusher(live_hub, pushed, confirm_s=10)
    task = asyncio.create_task(pusher.run())
    try:
        await call(live_hub, "t", "w", "claude-code", fixture("claude-code", "SessionEnd"))
        new = "0b7e2f4c-1111-4c2d-9e3f-5a6b7c8d9e0f"
        cleared = {**start, "source": "clear", "session_id": new}
        await call(live_hub, "t", "w", "claude-code", cleared)
        # the server's next beat, as :func:`backchannel.interfaces.mcp.beat` makes it
        pusher.runs_here((await live_hub.runtime_alive("t", "w", key["backchannel_runtime"]))[0])
        r = await live_hub.send("t", "lead", "w", "wake the new one")
        await eventually(lambda: pushed, what="a push into the new conversation")
        assert pushed[0][1]["message_id"] == r.message_id
        prompt = f"{_tag(r.message_id)}\n{pushed[0][0]}\n</channel>"
        shown = fixture("claude-code", "UserPromptSubmit", session_id=new, prompt=prompt)
        await call(live_hub, "t", "w", "claude-code", shown)
        assert await _state(live_hub, r.message_id) == ("acked", 1)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_busy_session_gets_no_push(ready: Hub) -> None:
    pushed: list[tuple[str, dict[str, str]]] = []
    await call(ready, "t", "w", "claude-code", fixture("claude-code", PROMPT_EVENT["claude-code"]))
    pusher = await _pusher(ready, pushed)
    task = asyncio.create_task(pusher.run())
    try:
        r = await ready.send("t", "lead", "w", "for after the turn")
        res = await call(
            ready, "t", "w", "claude-code", fixture("claude-code", STOP_EVENT["claude-code"])
        )
        assert "for after the turn" in res.answer["reason"]  # the Stop route had it
        await call(ready, "t", "w", "claude-code", fixture("claude-code", "PreToolUse"))
        assert await _state(ready, r.message_id) == ("acked", 1)
        assert pushed == []
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_client_that_does_not_listen_gets_its_messages_back_at_once(
    ready: Hub,
) -> None:
    pushed: list[tuple[str, dict[str, str]]] = []
    pusher = await _pusher(ready, pushed, confirm_s=0.3)
    task = asyncio.create_task(pusher.run())
    try:
        r = await ready.send("t", "lead", "w", "nobody listens")
        await eventually(lambda: pusher.live is False, what="probation over")
        assert await _state(ready, r.message_id) == ("queued", 1)
        # the next prompt hands it over, and the pusher has stopped for good
        res = await call(
            ready, "t", "w", "claude-code", fixture("claude-code", PROMPT_EVENT["claude-code"])
        )
        assert "nobody listens" in res.answer["hookSpecificOutput"]["additionalContext"]
        assert len(pushed) == 1
        await asyncio.wait_for(task, 5)
    finally:
        task.cancel()


# -- the wire --------------------------------------------------------------------------


def test_the_front_declines_discovery_so_the_connection_takes_channels() -> None:
    import io

    out = io.BytesIO()
    wire = json.loads(Path("src/backchannel/interfaces/mcp_wire.json").read_text())
    front = Front(wire, out)  # type: ignore[arg-type]
    front.received(json.dumps({"jsonrpc": "2.0", "id": "d", "method": "server/discover"}))
    (answer,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answer["error"]["code"] == -32601
    hello = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "claude-code", "version": "2.1.330"},
    }
    front.received(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}))
    result = json.loads(out.getvalue().splitlines()[1])["result"]
    assert result["capabilities"]["experimental"] == {"claude/channel": {}}


async def test_released_over_http_a_leased_message_is_queued_again(server: Any) -> None:
    from backchannel.client import Client

    tokens = server.team("h", "w", "lead")
    async with Client(server.url, tokens["lead"]) as lead:
        sent = await lead.send("w", "give it back", link=False)
    async with Client(server.url, tokens["w"]) as w:
        (got,) = await w.receive(limit=1)
        assert got.message_id == sent["message_id"]
        assert await w.release([got.message_id]) == 1
        status = await w.status(got.message_id)
        assert status["deliveries"][0]["state"] == "queued"
        assert await w.release([got.message_id]) == 0  # nothing leased any more


async def test_notices_alone_are_not_pushed_and_ride_with_the_next_message(ready: Hub) -> None:
    # a turn whose closing text names nobody leaves a notice for the session
    await call(ready, "t", "w", "claude-code", fixture("claude-code", PROMPT_EVENT["claude-code"]))
    bogus = '<message to="nobody">x</message>'
    stop = fixture("claude-code", STOP_EVENT["claude-code"], last_assistant_message=bogus)
    assert (await call(ready, "t", "w", "claude-code", stop)).answer == {}
    pushed: list[tuple[str, dict[str, str]]] = []
    pusher = await _pusher(ready, pushed, confirm_s=60)
    task = asyncio.create_task(pusher.run())
    try:
        await eventually(lambda: pusher._hold is not None, what="the notice held back")
        assert pushed == []
        r = await ready.send("t", "lead", "w", "now something real")
        await eventually(lambda: len(pushed) == 2, what="both pushed")
        (notice, meta), (text, real) = pushed
        assert meta["kind"] == "system" and notice.startswith("[backchannel] ")
        assert (real["message_id"], text) == (r.message_id, "[From lead] now something real")
        # leased by the Stop hook and given back, once more by the pusher and given back,
        # then once with the real message: not again and again while it waited
        assert await _state(ready, meta["message_id"]) == ("leased", 3)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("client", ["claude-code", "codex-mcp-client"])
async def test_the_server_learns_the_clients_name_at_the_handshake(client: str) -> None:
    from mcp.server.stdio import stdio_server

    from backchannel.interfaces import mcp

    names: list[str] = []

    async def nobody(ctx: Any) -> Any:
        raise AssertionError("no tool is called")

    server = mcp.build_server(nobody, connected=names.append)
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}}
    hello["clientInfo"] = {"name": client, "version": "1"}
    script = mcp._Script(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        ],
        last_id=2,
    )
    async with stdio_server(script, script) as (read, write):  # type: ignore[arg-type]
        await server.run(read, write, mcp.init_options(server))
    # serve_stdio starts pushing only when this name is mcp.CHANNEL_CLIENT (Claude Code)
    assert names == [client]
    assert script.answers[1]["capabilities"]["experimental"] == {"claude/channel": {}}
