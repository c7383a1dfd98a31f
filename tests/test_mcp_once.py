"""An MCP ``send_message`` or ``delegate`` made again is made once.

A runtime's MCP client gives up on a tool call while the hub is slow (Codex after 60 s,
Gemini CLI after 10 minutes, Claude Code after ``MCP_TOOL_TIMEOUT``) and cancels it
(``notifications/cancelled``; over HTTP it hangs up), though the hub had stored the send;
or the hub's answer is lost on the way. The model is told the call failed and makes it
again: the teammate must see the message once, and a delegation must run once. Real MCP
client sessions, over stdio (``backchannel mcp`` behind a proxy that holds the hub's
answer) and over HTTP (``/mcp``), cancel at pinned moments."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

import httpx
import pytest

from backchannel.client import Client
from backchannel.errors import PeerError
from backchannel.hub import Hub
from backchannel.interfaces import mcp
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing.waiting import eventually
from tests.conftest import BIN, Server
from tests.runtimes.agents import http_mcp, make_team, memory_session, stdio_mcp, text
from tests.test_mcp import errlog, srv
from tests.test_sdk_faults import Faulty

__all__ = ["errlog", "srv"]  # the fixtures, used here too

CALLS = {
    "send_message": ("/v1/messages", {"to": "b", "message": "deploy at noon"}),
    "delegate": ("/v1/delegations", {"to": "b", "task": "count the lines in src/"}),
}

#: how the answer to a call begins when an earlier call made it (a replay), and when
#: this call did
AGAIN = {
    "send_message": "Already sent to b (message_id ",
    "delegate": "Already delegated to b (delegation dlg_",
}
FIRST = {"send_message": "Sent to b (message_id ", "delegate": "Delegated to b; "}


def _open_turn(srv: Server, token: str) -> None:
    """a's runtime opened session a-1 and a turn (a delegation is made from a turn)."""
    with srv.client(token) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
        c.post("/v1/sessions/a-1/events", json={"kind": "turn_start"}).raise_for_status()


def _made(srv: Server, tokens: dict[str, str], tool: str) -> list[str]:
    """What reached b: the messages in its inbox, or the delegations b was asked."""
    with srv.client(tokens["b"]) as c:
        if tool == "delegate":
            found = c.get("/v1/delegations").json()["delegations"]
            return [d["task"] for d in found if d["callee"] == "b"]
        got = c.get("/v1/inbox", params={"limit": 50}).json()["messages"]
        return [m["text"] for m in got if m["from"] == "a"]


@pytest.mark.parametrize("tool", sorted(CALLS))
async def test_a_stdio_call_cancelled_after_the_hub_stored_it_is_made_once(
    srv: Server, errlog: TextIO, tool: str
) -> None:
    """The hub stored the call, its answer is held on the way; the client cancels the
    tool call (a timeout's ``notifications/cancelled``) and the model makes the same call
    again, while the first is still on its way, then after: one message, one delegation."""
    team = f"once-stdio-{tool}"
    tokens = make_team(srv, team, "a", "b")
    _open_turn(srv, tokens["a"])
    path, args = CALLS[tool]
    with contextlib.closing(Faulty(srv.url)) as proxy:
        proxy.faults.append(("POST", path, "late"))
        env = {"BACKCHANNEL_URL": proxy.url, "BACKCHANNEL_TOKEN": tokens["a"]}
        env["BACKCHANNEL_SESSION"] = "a-1"
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # this source, not another
        async with stdio_mcp(env, errlog) as s:
            first = asyncio.create_task(s.call_tool(tool, args))
            await eventually(proxy.answered.is_set, within=30, what="the hub to store it")
            first.cancel()  # the SDK tells the server: notifications/cancelled
            with pytest.raises(asyncio.CancelledError):
                await first
            again = asyncio.create_task(s.call_tool(tool, args))
            proxy.release.set()  # the first call's answer goes on, to nobody
            result = await asyncio.wait_for(again, 30)
            assert not result.is_error, text(result)
            assert text(result).startswith(AGAIN[tool]), text(result)
            assert result.structured_content["replayed"] is True
    assert len(_made(srv, tokens, tool)) == 1, "reached the teammate once"


@pytest.mark.parametrize("tool", sorted(CALLS))
async def test_the_stdio_servers_own_retries_make_a_call_once(
    srv: Server, errlog: TextIO, tool: str
) -> None:
    """The hub did the call and the connection broke before its answer came back: the
    stdio server's client makes it again under the id it gave the tool call, and the
    hub answers the first result. The model sees one plain success, the teammate one
    message (one delegation)."""
    team = f"once-cut-{tool}"
    tokens = make_team(srv, team, "a", "b")
    _open_turn(srv, tokens["a"])
    path, args = CALLS[tool]
    with contextlib.closing(Faulty(srv.url)) as proxy:
        proxy.faults.append(("POST", path, "cut"))
        env = {"BACKCHANNEL_URL": proxy.url, "BACKCHANNEL_TOKEN": tokens["a"]}
        env["BACKCHANNEL_SESSION"] = "a-1"
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
        async with stdio_mcp(env, errlog) as s:
            result = await asyncio.wait_for(s.call_tool(tool, args), 30)
        assert [w for _, p, w in proxy.seen if p == path] == ["cut", "pass"]
    assert not result.is_error, text(result)
    # the client's retry is no earlier call of the model's
    assert text(result).startswith(FIRST[tool]), text(result)
    assert len(_made(srv, tokens, tool)) == 1, "reached the teammate once"


class _Gate:
    """The first send or delegate of any of a member's clients reaches the hub, then
    holds its answer until :attr:`go`: a hub that stored the call and is slow to say so."""

    def __init__(self) -> None:
        self.stored = asyncio.Event()
        self.go = asyncio.Event()


class _Slow:
    """A member's client behind :class:`_Gate`."""

    def __init__(self, client: Any, gate: _Gate) -> None:
        self._client = client
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def _late(self, answer: Any) -> Any:
        if not self._gate.stored.is_set():
            self._gate.stored.set()
            await self._gate.go.wait()
        return answer

    async def send(self, *a: Any, **kw: Any) -> Any:
        return await self._late(await self._client.send(*a, **kw))

    async def delegate(self, *a: Any, **kw: Any) -> Any:
        return await self._late(await self._client.delegate(*a, **kw))


@contextlib.asynccontextmanager
async def _slowed_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: _Gate
) -> AsyncIterator[tuple[str, str, str]]:
    """A real hub on a socket whose ``/mcp`` agents reach the hub through ``gate``
    (:class:`_Slow`), members ``a`` (its session ``a-1`` in a turn) and ``b``: yields the
    URL and the two tokens."""
    import uvicorn

    from backchannel.interfaces import agents_http
    from backchannel.interfaces.http import create_app

    resolve = agents_http.McpEndpoint._resolve

    async def slowed(self: Any, ctx: Any) -> Any:
        agent = await resolve(self, ctx)
        slow = _Slow(agent.client, gate)
        return mcp.Agent(slow, agent.team, agent.name, agent.session)  # type: ignore[arg-type]

    monkeypatch.setattr(agents_http.McpEndpoint, "_resolve", slowed)
    hub = Hub(SqliteStore(tmp_path / "hub.db"))
    server = uvicorn.Server(
        uvicorn.Config(create_app(hub, "admin"), host="127.0.0.1", port=0, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started, what="the hub to listen")
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        await hub.create_team("t")
        a = (await hub.add_member("t", "a"))[1]
        b = (await hub.add_member("t", "b"))[1]
        async with Client(url, a) as client:
            await client.open_session("a-1")
            await client.report_event("a-1", "turn_start")
        yield url, a, b
    finally:
        server.should_exit = True
        await serving
        await hub.close()


def _http_headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Backchannel-Session": "a-1",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }


async def _reached_b(url: str, b: str, tool: str) -> list[Any]:
    """What of ``a``'s reached ``b``: the delegations b was asked, or a's messages."""
    async with Client(url, b) as client:
        if tool == "delegate":
            return [d for d in await client.delegations() if d.callee == "b"]
        return [m for m in await client.receive(limit=50) if m.sender == "a"]


@pytest.mark.parametrize("tool", sorted(CALLS))
async def test_an_http_call_whose_client_hangs_up_after_the_hub_stored_it_is_made_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    """Over ``/mcp`` the client hangs up (it gave up waiting) after the hub stored the
    call; the model makes the same call again in a new MCP session: made once."""
    gate = _Gate()
    kept = asyncio.Event()  # the server saw the call go unanswered
    keep = mcp.Unanswered.keep

    def spied(self: mcp.Unanswered, *a: Any) -> None:
        keep(self, *a)
        kept.set()

    monkeypatch.setattr(mcp.Unanswered, "keep", spied)
    async with _slowed_hub(tmp_path, monkeypatch, gate) as (url, a, b):
        _, args = CALLS[tool]
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
        call["params"] = {"name": tool, "arguments": args}
        headers = _http_headers(a)
        async with httpx.AsyncClient(base_url=url) as http:
            posting = asyncio.create_task(http.post("/mcp", json=call, headers=headers))
            await eventually(gate.stored.is_set, what="the hub to store it")
            posting.cancel()  # the client hangs up
            with contextlib.suppress(asyncio.CancelledError):
                await posting
        await asyncio.wait_for(kept.wait(), 20)
        async with http_mcp(url, a, "a-1") as s:
            again = asyncio.create_task(s.call_tool(tool, args))
            gate.go.set()
            result = await asyncio.wait_for(again, 30)
        assert not result.is_error, text(result)
        assert text(result).startswith(AGAIN[tool]), text(result)
        assert result.structured_content["replayed"] is True
        assert len(await _reached_b(url, b, tool)) == 1, "reached the teammate once"


class _Lost:
    """A member's client whose first send reaches the hub and whose answer is lost."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.lost = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def send(self, *a: Any, **kw: Any) -> Any:
        answer = await self._client.send(*a, **kw)
        if not self.lost:
            self.lost = True
            raise PeerError("the answer to POST /v1/messages was lost on the way back")
        return answer


async def test_a_send_whose_answer_was_lost_names_the_id_that_sends_it_once(
    srv: Server,
) -> None:
    """The hub stored the send and its answer was lost: the tool's error tells the model
    the id to call again with; called again with it, or as it was, it is sent once."""
    tokens = make_team(srv, "once-lost", "a", "b")
    async with Client(srv.url, tokens["a"]) as client:
        agent = mcp.Agent(_Lost(client), "once-lost", "a")  # type: ignore[arg-type]
        async with memory_session(agent) as s:
            args = {"to": "b", "message": "deploy at noon"}
            failed = await s.call_tool("send_message", args)
            assert failed.is_error
            said = text(failed)
            assert "Call send_message again with the same arguments and id='" in said, said
            ident = said.split("id='")[1].split("'")[0]
            # made again as it was, without the id: the server kept it
            plain = await s.call_tool("send_message", args)
            assert not plain.is_error, text(plain)
            assert text(plain) == (
                f"Already sent to b (message_id {ident}): an earlier call made this send, "
                "and the message is delivered once."
            )
            # and with the id the error named (from a new server, say): the hub knows it
            again = await s.call_tool("send_message", {**args, "id": ident})
            assert text(again).startswith(f"Already sent to b (message_id {ident})")
            # an id the model gives on its first call is the message's
            own = await s.call_tool("send_message", {**args, "message": "two", "id": "a-note-2"})
            assert text(own) == "Sent to b (message_id a-note-2)."
            bad = await s.call_tool("send_message", {**args, "id": "no spaces"})
            assert bad.is_error and "invalid argument 'id'" in text(bad)
    assert _made(srv, tokens, "send_message") == ["deploy at noon", "two"]


def _rpc(ident: int, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    params = {"name": tool, "arguments": args}
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}


def _cancel(ident: int) -> dict[str, Any]:
    params = {"requestId": ident, "reason": "McpError: MCP error -32001: Request timed out"}
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}


@pytest.mark.parametrize("tool", sorted(CALLS))
def test_a_stdio_cancel_that_crossed_the_answer_makes_the_call_again_once(
    srv: Server, tool: str
) -> None:
    """The client timed out just as the answer came: it dropped the answer and sent
    ``notifications/cancelled`` for a call the server had already answered (the SDK
    ignores it). The model, told the call timed out, makes it again: made once."""
    team = f"once-crossed-{tool}"
    tokens = make_team(srv, team, "a", "b")
    _open_turn(srv, tokens["a"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    env |= {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    env["BACKCHANNEL_SESSION"] = "a-1"
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
    hello["clientInfo"] = {"name": "test", "version": "0"}
    _, args = CALLS[tool]
    proc = subprocess.Popen(
        [str(BIN), "mcp"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None

    def say(*msgs: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in msgs))
        proc.stdin.flush()

    def answer() -> dict[str, Any]:
        assert proc.stdout is not None
        got: dict[str, Any] = json.loads(proc.stdout.readline())
        return got

    try:
        say({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        assert answer()["id"] == 1
        say({"jsonrpc": "2.0", "method": "notifications/initialized"}, _rpc(2, tool, args))
        first = answer()
        assert first["id"] == 2 and not first["result"].get("isError"), first
        say(_cancel(2), _rpc(3, tool, args))
        again = answer()
        assert again["id"] == 3 and not again["result"].get("isError"), again
        if tool == "send_message":
            said = again["result"]["content"][0]["text"]
            assert said.startswith("Already sent to b (message_id "), said
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()
    assert len(_made(srv, tokens, tool)) == 1, "reached the teammate once"


@pytest.mark.parametrize("tool", sorted(CALLS))
async def test_an_http_cancel_of_a_call_the_hub_stored_makes_it_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    """Over stateless ``/mcp`` a client that times out does not hang up: it sends
    ``notifications/cancelled`` in a request of its own, which the SDK cannot match to
    the call. The endpoint hears it; the same call made again is made once."""
    gate = _Gate()
    async with _slowed_hub(tmp_path, monkeypatch, gate) as (url, a, b):
        _, args = CALLS[tool]
        headers = _http_headers(a)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            first = asyncio.create_task(http.post("/mcp", json=_rpc(7, tool, args)))
            await eventually(gate.stored.is_set, what="the hub to store it")
            r = await http.post("/mcp", json=_cancel(7))
            assert r.status_code == 202, r.text
            gate.go.set()
            assert (await first).status_code == 200  # to a client that no longer reads it
            again = (await http.post("/mcp", json=_rpc(1, tool, args))).json()
        assert not again["result"].get("isError"), again
        if tool == "send_message":
            said = again["result"]["content"][0]["text"]
            assert said.startswith("Already sent to b (message_id "), said
        assert len(await _reached_b(url, b, tool)) == 1, "reached the teammate once"


async def test_a_cancel_naming_a_request_id_of_long_ago_marks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client's request ids start again in each connection: a cancel of request 2
    past the window is of another call than the send made as request 2 back then."""
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    kept = mcp.Unanswered()
    ask = ("t", "a", None, 2)
    monkeypatch.setattr(mcp, "UNANSWERED_S", -1.0)  # made past the window already
    kept.made(ask, ("send", "b", "hi"), "m1", done)
    monkeypatch.setattr(mcp, "UNANSWERED_S", 600.0)
    kept.cancelled(ask)
    assert kept.take(("send", "b", "hi")) is None
    kept.made(ask, ("send", "b", "hi"), "m2", done)
    kept.cancelled(ask)
    assert kept.take(("send", "b", "hi")) == ("m2", done)


def _hold_receives(monkeypatch: pytest.MonkeyPatch) -> None:
    """:class:`_Slow` holds the first receive's answer too (a hub slow to lease)."""

    async def held_receive(self: _Slow, *a: Any, **kw: Any) -> Any:
        return await self._late(await self._client.receive(*a, **kw))

    monkeypatch.setattr(_Slow, "receive", held_receive, raising=False)


async def test_an_http_check_inbox_cancelled_under_way_gives_its_messages_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that times out a ``check_inbox`` over stateless ``/mcp`` while the hub
    leases, as the TypeScript SDK's (Claude Code, Gemini CLI) does: it sends
    ``notifications/cancelled`` in a request of its own, keeps the call's connection
    and drops its answer unread. The endpoint did not match the cancel to the call,
    answered it and acked what it carried: the message was gone, never shown to the
    model. The call under way is now stopped unanswered (a JSON-RPC error) and what it
    leased is given back, for the next ``check_inbox``."""
    gate = _Gate()
    _hold_receives(monkeypatch)
    async with _slowed_hub(tmp_path, monkeypatch, gate) as (url, a, b):
        async with Client(url, b) as client:
            sent = (await client.send("a", "deploy at noon")).message_id
        async with httpx.AsyncClient(base_url=url, headers=_http_headers(a), timeout=30) as http:
            first = asyncio.create_task(http.post("/mcp", json=_rpc(7, "check_inbox", {})))
            await eventually(gate.stored.is_set, what="the hub to lease the message")
            r = await http.post("/mcp", json=_cancel(7))
            assert r.status_code == 202, r.text
            gate.go.set()
            answer = (await first).json()
        async with Client(url, a) as client:
            back = await client.receive(wait=5)
        assert [m.message_id for m in back] == [sent], "the message came back at once"
        assert answer["id"] == 7 and answer["error"]["code"] == -32800, answer


async def test_the_official_clients_check_inbox_timeout_gives_its_messages_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The official Python MCP client, timing out a ``check_inbox`` over ``/mcp``
    while the hub leases, sends ``notifications/cancelled`` and hangs up: whichever the
    endpoint hears first, what the call leased is given back, never acked."""
    gate = _Gate()
    _hold_receives(monkeypatch)
    heard = asyncio.Event()  # the endpoint heard the client's cancel
    cancelled = mcp.Unanswered.cancelled

    def spy(self: mcp.Unanswered, request: tuple[Any, ...]) -> None:
        cancelled(self, request)
        heard.set()

    monkeypatch.setattr(mcp.Unanswered, "cancelled", spy)
    async with _slowed_hub(tmp_path, monkeypatch, gate) as (url, a, b):
        async with Client(url, b) as client:
            sent = (await client.send("a", "deploy at noon")).message_id
        async with http_mcp(url, a, "a-1") as session:
            call = asyncio.ensure_future(
                session.call_tool("check_inbox", {}, read_timeout_seconds=0.5)
            )
            await eventually(gate.stored.is_set, what="the hub to lease the message")
            await eventually(heard.is_set, what="the client's cancel to reach the hub")
            gate.go.set()
            with pytest.raises(Exception, match="timed out"):
                await call
        async with Client(url, a) as client:
            back = await client.receive(wait=5)
        assert [m.message_id for m in back] == [sent], "the message came back at once"
