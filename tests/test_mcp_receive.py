"""An MCP ``check_inbox`` cut short loses nothing and shows nothing twice.

The client cancels a running ``check_inbox`` (Claude Code when the user presses Esc:
``notifications/cancelled``; Codex after its tool timeout; over HTTP it may hang up),
or the CLI quits and closes the stdio server's stdin, while the hub's answer to the
lease is still on its way: the hub has leased the messages, the tool has not seen
them. They must be the next call's at once (not held for the lease's minute, an
attempt spent), and what an answer showed must not come again. Real MCP client
sessions against ``backchannel mcp`` behind a proxy that holds the hub's answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

import httpx
import pytest

from backchannel.testing.waiting import eventually
from tests.conftest import BIN, Server
from tests.runtimes.agents import make_team, stdio_mcp, text
from tests.test_mcp import errlog, srv
from tests.test_sdk_faults import Faulty

__all__ = ["errlog", "srv"]  # the fixtures, used here too


def _env(url: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    return env | {"BACKCHANNEL_URL": url, "BACKCHANNEL_TOKEN": token}


def _inbox_state(srv: Server, token: str, ident: str) -> dict[str, Any]:
    with srv.client(token) as c:
        got: dict[str, Any] = c.get(f"/v1/messages/{ident}").json()["deliveries"][0]
        return got


async def test_a_stdio_check_inbox_cancelled_while_the_lease_comes_back_gives_it_back(
    srv: Server, errlog: TextIO
) -> None:
    """The hub leased the message and its answer is on the way when the client cancels
    (``notifications/cancelled``): the message is the next call's at once, shown once."""
    tokens = make_team(srv, "recv-cancel", "a", "b")
    with srv.client(tokens["b"]) as c:
        ident = c.post("/v1/messages", json={"to": "a", "text": "read me once"}).json()[
            "message_id"
        ]
    with contextlib.closing(Faulty(srv.url)) as proxy:
        proxy.faults.append(("GET", "/v1/inbox", "late"))
        async with stdio_mcp(_env(proxy.url, tokens["a"]), errlog) as s:
            first = asyncio.create_task(s.call_tool("check_inbox", {}))
            await eventually(proxy.answered.is_set, within=30, what="the hub to lease it")
            first.cancel()  # the SDK tells the server: notifications/cancelled
            with pytest.raises(asyncio.CancelledError):
                await first
            proxy.release.set()  # the lease's answer goes on, to a call that is gone
            async with asyncio.timeout(20):  # at once: well within the lease's 60 s
                while True:
                    got = await s.call_tool("check_inbox", {})
                    if got.structured_content["messages"]:
                        break
            assert len(got.structured_content["messages"]) == 1
            assert "] read me once\n" in got.structured_content["text"]
            again = await s.call_tool("check_inbox", {})
            assert text(again) == "No new messages."
    print(_inbox_state(srv, tokens["a"], ident))


@contextlib.asynccontextmanager
async def _hub_and_one_message(
    tmp_path: Path,
) -> AsyncIterator[tuple[str, str]]:
    """A hub serving ``/mcp`` on a real socket (its URL given), and member ``a`` (its
    token given) with one message from ``b`` waiting."""
    import uvicorn

    from backchannel.client import Client
    from backchannel.hub import Hub
    from backchannel.interfaces.http import create_app
    from backchannel.stores.sqlite import SqliteStore

    hub = Hub(SqliteStore(tmp_path / "hub.db"))
    config = uvicorn.Config(create_app(hub, "admin"), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started, what="the hub to listen")
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        await hub.create_team("t")
        a = (await hub.add_member("t", "a"))[1]
        b = (await hub.add_member("t", "b"))[1]
        async with Client(url, b) as client:
            await client.send("a", "read me once")
        yield url, a
    finally:
        server.should_exit = True
        await serving
        await hub.close()


def _check_inbox(url: str, token: str) -> asyncio.Task[httpx.Response]:
    """A ``check_inbox`` call posted to ``/mcp`` as the member of ``token``, under way,
    by a client of its own: cancelling the task hangs up (its connection closes)."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    call["params"] = {"name": "check_inbox", "arguments": {}}
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(base_url=url) as http:
            return await http.post("/mcp", json=call, headers=headers)

    return asyncio.create_task(post())


async def _hang_up(posting: asyncio.Task[httpx.Response]) -> None:
    """The client hangs up on its call."""
    posting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await posting


async def _given_back(url: str, token: str) -> None:
    """The message is the member's next receive's at once (well within the 60 s lease)."""
    from backchannel.client import Client

    async with Client(url, token) as client:
        got: list[Any] = []
        async with asyncio.timeout(20):
            while not got:
                got = await client.receive(wait=1)
        assert [m.text for m in got] == ["read me once"]


def _rpc(ident: int, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params}).encode()


def test_a_stdio_check_inbox_whose_cli_quits_while_the_lease_comes_back_loses_nothing(
    srv: Server,
) -> None:
    """The CLI quits (the server's stdin closes) while the hub's answer to the lease is
    on its way: the message is in the answer the server still writes, or it is the next
    receive's at once; never acked unseen, never held for the lease's minute."""
    tokens = make_team(srv, "recv-quit", "a", "b")
    with srv.client(tokens["b"]) as c:
        c.post("/v1/messages", json={"to": "a", "text": "read me once"}).raise_for_status()
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
    hello["clientInfo"] = {"name": "test", "version": "0"}
    with contextlib.closing(Faulty(srv.url)) as proxy:
        proxy.faults.append(("GET", "/v1/inbox", "late"))
        proc = subprocess.Popen(
            [str(BIN), "mcp"],
            env=_env(proxy.url, tokens["a"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(_rpc(1, "initialize", hello) + b"\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            call = _rpc(2, "tools/call", {"name": "check_inbox", "arguments": {}})
            proc.stdin.write(json.dumps(initialized).encode() + b"\n" + call + b"\n")
            proc.stdin.flush()
            assert proxy.answered.wait(30), "the hub to lease it"
            proc.stdin.close()  # the CLI quits mid-call
            proxy.release.set()
            out = proc.stdout.read()
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    shown = [
        m["text"]
        for r in answers
        if r.get("id") == 2 and "result" in r
        for m in r["result"].get("structuredContent", {}).get("messages", [])
    ]
    with srv.client(tokens["a"]) as c:
        left = [m["text"] for m in c.get("/v1/inbox", params={"limit": 10}).json()["messages"]]
    assert shown + left == ["read me once"], (answers, left)


class _Held:
    """A member's client whose first receive leases, then holds the hub's answer until
    :attr:`go` (its answer on the way when the client hangs up)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.leased = asyncio.Event()
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def receive(self, **kw: Any) -> Any:
        got = await self._client.receive(**kw)
        if not self.leased.is_set():
            self.leased.set()
            await self.go.wait()
        return got


async def test_an_http_check_inbox_whose_client_hangs_up_while_the_lease_comes_back_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over ``/mcp`` the client hangs up once the hub has leased the message, before the
    tool has its answer: the message is the next receive's at once."""

    from backchannel.interfaces import agents_http
    from backchannel.interfaces.mcp import Agent

    held: list[_Held] = []
    resolve = agents_http.McpEndpoint._resolve

    async def holding(self: Any, ctx: Any) -> Any:
        agent = await resolve(self, ctx)
        held.append(_Held(agent.client))
        return Agent(held[-1], agent.team, agent.name, agent.session)  # type: ignore[arg-type]

    monkeypatch.setattr(agents_http.McpEndpoint, "_resolve", holding)
    ended = asyncio.Event()  # the hub is done with the POST
    unless_gone = agents_http.McpEndpoint._unless_gone

    async def watched(*args: Any) -> None:
        try:
            await unless_gone(*args)
        finally:
            ended.set()

    monkeypatch.setattr(agents_http.McpEndpoint, "_unless_gone", staticmethod(watched))
    async with _hub_and_one_message(tmp_path) as (url, a):
        posting = _check_inbox(url, a)
        await eventually(lambda: held and held[0].leased.is_set(), what="the lease")
        await _hang_up(posting)
        await asyncio.wait_for(ended.wait(), 20)  # the hub saw the hang-up, stopped the call
        held[0].go.set()  # the lease's answer comes, to a call that is gone
        await _given_back(url, a)


async def test_an_http_check_inbox_whose_client_hangs_up_before_its_answer_is_written_acks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over ``/mcp`` the tool has its answer, and the client hangs up before the answer
    is written: what the answer carried reached no one, so it is the next receive's at
    once, not acked unseen."""
    from backchannel.interfaces import agents_http

    answering = asyncio.Event()  # the answer is about to be written
    hung_up = asyncio.Event()  # the client is gone
    unless_gone = agents_http.McpEndpoint._unless_gone

    async def held(manager: Any, scope: Any, receive: Any, send: Any, *rest: Any) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                answering.set()
                await hung_up.wait()
            await send(message)

        await unless_gone(manager, scope, receive, sending, *rest)

    monkeypatch.setattr(agents_http.McpEndpoint, "_unless_gone", staticmethod(held))
    async with _hub_and_one_message(tmp_path) as (url, a):
        posting = _check_inbox(url, a)
        try:  # the answer stays unwritten until the message was given back
            await asyncio.wait_for(answering.wait(), 20)
            await _hang_up(posting)
            await _given_back(url, a)
        finally:
            hung_up.set()


def test_a_stdio_check_inbox_whose_cancel_crossed_its_answer_gives_the_messages_back(
    srv: Server,
) -> None:
    """The client cancelled ``check_inbox`` (Esc, a tool timeout) as its answer went out:
    it drops that answer (a cancelled request's answer is ignored), so the model never
    saw the messages it carried. They are given back, and the next call shows them."""
    tokens = make_team(srv, "recv-crossed", "a", "b")
    with srv.client(tokens["b"]) as c:
        c.post("/v1/messages", json={"to": "a", "text": "read me once"}).raise_for_status()
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
    hello["clientInfo"] = {"name": "test", "version": "0"}
    proc = subprocess.Popen(
        [str(BIN), "mcp"],
        env=_env(srv.url, tokens["a"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
    cancel["params"] = {"requestId": 2, "reason": "the user pressed Esc"}
    check = {"name": "check_inbox", "arguments": {}}

    def say(*lines: bytes) -> None:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(line + b"\n" for line in lines))
        proc.stdin.flush()

    def answer() -> Any:
        assert proc.stdout is not None
        return json.loads(proc.stdout.readline())

    try:
        say(_rpc(1, "initialize", hello))
        assert answer()["id"] == 1
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        say(json.dumps(initialized).encode(), _rpc(2, "tools/call", check))
        dropped = answer()  # what the client no longer reads
        assert dropped["id"] == 2 and dropped["result"]["structuredContent"]["messages"]
        say(json.dumps(cancel).encode())
        shown: list[str] = []
        ident = 3
        deadline = time.monotonic() + 20  # given back at once: well within the lease's 60 s
        while not shown and time.monotonic() < deadline:
            say(_rpc(ident, "tools/call", check))
            got = answer()
            assert got["id"] == ident
            content = got["result"]["structuredContent"]
            shown = [content["text"]] if content["messages"] else []
            ident += 1
        assert len(shown) == 1 and "] read me once\n" in shown[0], shown
        say(_rpc(ident, "tools/call", check))
        assert answer()["result"]["structuredContent"]["messages"] == []
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()


def test_what_a_stdio_check_inbox_answered_is_acked_when_the_cli_quits_right_after(
    srv: Server,
) -> None:
    """The CLI reads the answer and quits at once (stdin closed): no cancel can come, so
    the server acks what the answer carried before it exits, not a moment later."""
    tokens = make_team(srv, "recv-read-quit", "a", "b")
    with srv.client(tokens["b"]) as c:
        c.post("/v1/messages", json={"to": "a", "text": "read me once"}).raise_for_status()
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
    hello["clientInfo"] = {"name": "test", "version": "0"}
    proc = subprocess.Popen(
        [str(BIN), "mcp"],
        env=_env(srv.url, tokens["a"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(_rpc(1, "initialize", hello) + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        call = _rpc(2, "tools/call", {"name": "check_inbox", "arguments": {}})
        proc.stdin.write(json.dumps(initialized).encode() + b"\n" + call + b"\n")
        proc.stdin.flush()
        got = json.loads(proc.stdout.readline())
        content = got["result"]["structuredContent"]
        assert len(content["messages"]) == 1 and "] read me once\n" in content["text"]
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    with srv.client(tokens["a"]) as c:
        assert c.get("/v1/inbox/pending").json()["pending"] == 0
