"""The MCP server through the official MCP client: over stdio (``backchannel mcp``
against a real server, and in-process on a data directory) and over streamable HTTP
(``/mcp`` on ``backchannel serve``). Every tool is called; bad arguments come back as
tool errors that name the argument."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import httpx
import pytest
from mcp import ClientSession

from backchannel.client import Client
from backchannel.hub import Hub
from backchannel.interfaces.mcp import NOTHING_MID_TURN
from backchannel.stores.sqlite import SqliteStore
from tests.conftest import BIN, Server, start_server
from tests.runtimes.agents import http_mcp, make_team, memory_session, stdio_mcp, text

TOOLS = {
    "send_message",
    "check_inbox",
    "get_session_data",
    "list_members",
    "set_timer",
    "cancel_timer",
    "list_timers",
    "read_timer",
    "add_reaction",
    "read_message",
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("mcp") / "home")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    """Where the stdio server's stderr goes (the MCP client needs a real file)."""
    with open(tmp_path / "mcp-stderr.log", "w") as f:
        yield f


@asynccontextmanager
async def connect(
    transport: str, srv: Server, token: str, session: str | None, errlog: TextIO
) -> AsyncIterator[ClientSession]:
    if transport == "http":
        async with http_mcp(srv.url, token, session) as s:
            yield s
        return
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": token}
    if session:
        env["BACKCHANNEL_SESSION"] = session
    async with stdio_mcp(env, errlog) as s:
        yield s


async def ok(s: ClientSession, tool: str, **args: Any) -> tuple[str, Any]:
    result = await s.call_tool(tool, args)
    assert not result.is_error, text(result)
    return text(result), result.structured_content


async def fails(s: ClientSession, tool: str, **args: Any) -> str:
    result = await s.call_tool(tool, args)
    assert result.is_error, text(result)
    return text(result)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_every_tool(srv: Server, errlog: TextIO, transport: str) -> None:
    team = f"tools-{transport}"
    tokens = make_team(srv, team, "a:claude-code", "b:gemini")
    with srv.client(tokens["a"]) as c:  # a's runtime opened a session and a turn
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
        c.post("/v1/sessions/a-1/events", json={"kind": "turn_start"}).raise_for_status()
    async with connect(transport, srv, tokens["a"], "a-1", errlog) as s:
        listed = {t.name: t for t in (await s.list_tools()).tools}
        expected = TOOLS | ({"delegate"} if hasattr(Hub, "delegate") else set())
        assert set(listed) == expected
        send = listed["send_message"].input_schema
        assert send["required"] == ["to", "message"]
        assert send["additionalProperties"] is False
        assert send["properties"]["summary"]["type"] == "string"
        assert listed["set_timer"].input_schema["properties"]["intent"]["enum"] == [
            "anchor",
            "check",
            "wait",
        ]
        assert all(t.description and len(t.description) > 30 for t in listed.values())

        members, _ = await ok(s, "list_members")
        assert f"Team {team}:" in members
        assert "- a (you), claude-code; sessions: a-1 (active)" in members
        assert "- b, gemini" in members

        sent, data = await ok(s, "send_message", to="b", message="hello b", summary="greeting")
        assert sent.startswith("Sent to b (message_id ")
        assert data["text"] == sent, "the structured content leads with the same wording"
        mid = data["message_id"]
        reacted, _ = await ok(s, "add_reaction", message_id=mid, emoji="👍")
        assert reacted == f"Reacted 👍 to {mid}."

        timer_text, timer = await ok(
            s, "set_timer", intent="anchor", minutes=30, note="back to the plan"
        )
        assert f"anchor timer {timer['timer_id']} set on session a-1" in timer_text
        listed_timers, tdata = await ok(s, "list_timers")
        assert f"{timer['timer_id']}: anchor for a (session a-1, yours)" in listed_timers
        assert [t["timer_id"] for t in tdata["timers"]] == [timer["timer_id"]]
        cancelled, _ = await ok(s, "cancel_timer", id=timer["timer_id"])
        assert cancelled == f"Timer {timer['timer_id']} cancelled."

        transcript, tdata = await ok(s, "get_session_data", session="a-1")
        assert transcript.startswith("Session a-1 of a: active, turn 1.")
        assert "sent: hello b" in transcript  # the send belongs to a's open turn
        # each text once: in the answer's text, not again in the structured content a
        # client (Claude Code, Codex) shows the model beside or instead of it
        assert json.dumps(tdata).count("hello b") == 1, tdata
        assert tdata["events"] and all("text" not in e for e in tdata["events"])
        by_name, _ = await ok(s, "get_session_data", session="a", tail_chars=50)
        assert by_name.startswith("Session a-1 of a")

        inbox, _ = await ok(s, "check_inbox")  # a's turn runs
        assert inbox == NOTHING_MID_TURN or "[backchannel]" in inbox

        # bad arguments: tool errors that name the argument
        assert "argument 'to'" in await fails(s, "send_message", to="bb", message="x")
        assert "did you mean 'b'" in await fails(s, "send_message", to="bb", message="x")
        assert "missing argument 'to'" in await fails(s, "send_message", message="x")
        assert "unexpected argument 'urgent'" in await fails(
            s, "send_message", to="b", message="x", urgent=True
        )
        bad_timer = await fails(s, "set_timer", intent="nap", minutes=0, note="")
        for arg in ("intent", "minutes", "note"):
            assert f"invalid argument '{arg}'" in bad_timer
        assert "argument 'target'" in await fails(
            s, "set_timer", intent="check", minutes=1, note="n", target="nobody"
        )
        # cancelled again (a call made again when its answer was lost): the same answer
        again, _ = await ok(s, "cancel_timer", id=timer["timer_id"])
        assert again == f"Timer {timer['timer_id']} cancelled."
        assert "argument 'id'" in await fails(s, "cancel_timer", id=timer["timer_id"] + 10_000)
        assert "invalid argument 'id'" in await fails(s, "cancel_timer", id="seven")
        assert "invalid argument 'since'" in await fails(
            s, "get_session_data", session="a-1", since=-1
        )
        assert "argument 'session'" in await fails(s, "get_session_data", session="nope")
        # past a store's 64-bit integers: a bad argument, not an internal error
        assert "invalid argument 'since'" in await fails(
            s, "get_session_data", session="a-1", since=2**63
        )
        assert "invalid argument 'id'" in await fails(s, "cancel_timer", id=2**63)
        assert "argument 'message_id'" in await fails(
            s, "add_reaction", message_id="msg_nope", emoji="👍"
        )
        assert "unknown tool 'fly'" in await fails(s, "fly")

        if "delegate" in listed:
            started, data = await ok(s, "delegate", to="b", task="count the lines in src/")
            assert started.startswith("Delegated to b; this returns at once")
            assert "invalid argument 'timeout_s'" in await fails(
                s, "delegate", to="b", task="x", timeout_s=-1
            )

    async with connect("http", srv, tokens["b"], None, errlog) as s:
        inbox, data = await ok(s, "check_inbox")
        assert "[From a] hello b" in inbox
        assert f"(message_id: {mid})" in inbox
        assert (await ok(s, "check_inbox"))[0] == "No new messages."  # acked


async def test_the_mcp_endpoint_needs_a_member_token(srv: Server) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post("/mcp", json=body, headers=headers)
        # a JSON-RPC error, the hub's own as its data
        assert (r.status_code, r.json()["error"]["data"]["code"]) == (401, "unauthorized")
        assert r.json()["jsonrpc"] == "2.0" and r.json()["error"]["code"] == -32001
        assert "missing bearer token" in r.json()["error"]["message"]
        assert r.headers["www-authenticate"] == "Bearer"
        bad = {**headers, "Authorization": "Bearer bc_nope"}
        assert (await c.post("/mcp", json=body, headers=bad)).status_code == 401
        admin = {**headers, "Authorization": f"Bearer {srv.admin_token}"}
        r = await c.post("/mcp", json=body, headers=admin)
        assert (r.status_code, r.json()["error"]["data"]["code"]) == (403, "forbidden")


async def test_stdio_in_process_on_the_data_directory(tmp_path: Path, errlog: TextIO) -> None:
    home = tmp_path / "home"
    home.mkdir()
    async with Hub(SqliteStore(home / "backchannel.db")) as hub:
        await hub.create_team("local")
        _, token = await hub.add_member("local", "solo")
        await hub.add_member("local", "peer")
    env = {"BACKCHANNEL_HOME": str(home), "BACKCHANNEL_TOKEN": token}
    async with stdio_mcp(env, errlog) as s:
        members, _ = await ok(s, "list_members")
        assert "- solo (you), llm" in members
        await ok(s, "send_message", to="peer", message="offline hello")
    async with Hub(SqliteStore(home / "backchannel.db")) as hub:
        got = await hub.receive("local", "peer")
        assert [g.message.text for g in got] == ["offline hello"]


def test_stdio_refuses_a_wrong_token_or_member(srv: Server) -> None:
    tokens = make_team(srv, "refuse", "x")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    for token, args, message in [
        ("bc_nope", [], "invalid token"),
        (tokens["x"], ["--as", "refuse/y"], "belongs to refuse/x"),
    ]:
        run = subprocess.run(
            [str(BIN), "mcp", *args],
            env={**env, "BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": token},
            capture_output=True,
            text=True,
            input="",
            timeout=60,
        )
        assert run.returncode == 1
        assert message in run.stderr


#: Lines a client may really send that the MCP SDK would drop without an answer, so the
#: caller would wait for ever: a model's text with half an emoji pair, a number past any
#: parser, nesting past the stack, bytes that are not UTF-8, no JSON, no JSON-RPC.
_CALL = b'{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"send_message",'
REFUSED_LINES = [
    (_CALL % b"2" + b'"arguments":{"to":"b","message":"half \\ud83d a pair"}}}', 2, -32700),
    (_CALL % b'"s3"' + b'"arguments":{"to":"b","message":' + b"9" * 5000 + b"}}}", "s3", -32700),
    (_CALL % b"4" + b'"arguments":{"to":"b","message":"\xff\xfe"}}}', 4, -32700),
    (b'{"jsonrpc":"2.0","id":5,"m":' + b"[" * 50_000 + b"]" * 50_000 + b"}", None, -32700),
    (b"{not json", None, -32700),
    (b'{"jsonrpc":"2.0","id":6,"params":{}}', 6, -32600),
    (b"[1, 2]", None, -32600),
    (_CALL % b"7" + b'"arguments":[]}}', 7, -32602),  # read by the SDK, refused unnamed
    (_CALL % b"8" + b'"arguments":{"to":"b","message":NaN}}}', 8, -32700),
]


def _answers(proc: subprocess.Popen[bytes], n: int) -> list[dict[str, Any]]:
    """The next ``n`` lines the server writes (the test's timeout bounds the wait)."""
    assert proc.stdout is not None
    return [json.loads(proc.stdout.readline()) for _ in range(n)]


@pytest.mark.parametrize("through", ["hub", "data directory"])
def test_a_line_the_sdk_cannot_read_is_answered_and_the_server_goes_on(
    srv: Server, tmp_path: Path, through: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    if through == "hub":  # the quick front, then the server behind it
        tokens = make_team(srv, "lines", "a", "b")
        env |= {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    else:  # no hub running: the full CLI serves on the store itself
        home = tmp_path / "home"
        home.mkdir()
        token = asyncio.run(_team_on_store(home / "backchannel.db"))
        env |= {"BACKCHANNEL_HOME": str(home), "BACKCHANNEL_TOKEN": token}
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
    hello["clientInfo"] = {"name": "test", "version": "0"}
    lines = [
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ]
    proc = subprocess.Popen(
        [str(BIN), "mcp"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write("\n".join(lines).encode() + b"\n")
        for line, _, _ in REFUSED_LINES:
            proc.stdin.write(line + b"\n")
        ok = {"name": "send_message", "arguments": {"to": "b", "message": "still here 😀"}}
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                                     "params": ok}).encode() + b"\n")  # fmt: skip
        proc.stdin.flush()
        answers = _answers(proc, 2 + len(REFUSED_LINES))
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    # answers come as each is ready, not in the order asked: match them by id
    by_id = {a["id"]: a for a in answers if a["id"] is not None}
    assert "result" in by_id[1]
    nameless = sorted(a["error"]["code"] for a in answers if a["id"] is None)
    assert nameless == sorted(code for _, ident, code in REFUSED_LINES if ident is None)
    for _, ident, code in REFUSED_LINES:
        if ident is not None:
            assert by_id[ident]["error"]["code"] == code, by_id[ident]
    for got in answers:
        if "error" in got and got["error"]["code"] != -32602:
            assert "one JSON-RPC 2.0 message a line" in got["error"]["message"]
    assert "lone UTF-16 surrogate" in by_id[2]["error"]["message"]
    assert by_id[7]["error"]["message"] == (
        "Invalid params of tools/call: params.arguments: Input should be a valid dictionary; "
        "send the params the MCP specification gives for tools/call"
    )
    assert "NaN at line 1 column " in by_id[8]["error"]["message"]
    sent = by_id[9]
    assert not sent["result"]["isError"], sent
    # only the good call reached the hub; nothing refused was stored, mangled or not
    if through == "hub":
        with srv.client(tokens["b"]) as c:
            got = c.get("/v1/inbox", params={"limit": 20}).json()["messages"]
        texts = [m["text"] for m in got]
    else:
        texts = asyncio.run(_inbox_on_store(home / "backchannel.db"))
    assert texts == ["still here 😀"]


async def _team_on_store(db: Path) -> str:
    async with Hub(SqliteStore(db)) as hub:
        await hub.create_team("lines")
        await hub.add_member("lines", "b")
        _, token = await hub.add_member("lines", "a")
    return token


async def _inbox_on_store(db: Path) -> list[str]:
    async with Hub(SqliteStore(db)) as hub:
        return [g.message.text for g in await hub.receive("lines", "b")]


async def test_set_timer_takes_the_range_of_every_other_way_to_set_one(
    srv: Server, errlog: TextIO
) -> None:
    # the MCP tool, HTTP and the hub hold a timer to one range: 1 second to 30 days
    tokens = make_team(srv, "timer-range", "a")
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
        http = c.get("/openapi.json").json()["components"]["schemas"]["TimerIn"]
    async with connect("http", srv, tokens["a"], "a-1", errlog) as s:
        listed = {t.name: t for t in (await s.list_tools()).tools}
        minutes = listed["set_timer"].input_schema["properties"]["minutes"]
        assert (minutes["minimum"], minutes["maximum"]) == (
            http["properties"]["minutes"]["minimum"],
            http["properties"]["minutes"]["maximum"],
        )
        # 20 days, past the 7 the tool used to stop at
        _, data = await ok(s, "set_timer", intent="anchor", minutes=20 * 24 * 60, note="n")
        assert data["due_in"] == pytest.approx(20 * 24 * 3600, abs=60)
        for bad in (0.001, 30 * 24 * 60 + 1):
            assert "invalid argument 'minutes'" in await fails(
                s, "set_timer", intent="anchor", minutes=bad, note="n"
            )


async def test_list_members_answers_a_bounded_page_and_reads_on_past_it(
    srv: Server, errlog: TextIO
) -> None:
    """A big team's members are not all poured into the model's context: an answer
    names at most LIST_MEMBERS_SHOWN, by name, with their open sessions, and says how to
    read the next page; the pages together name every member once."""
    from backchannel.interfaces.mcp import LIST_MEMBERS_SHOWN

    names = [f"w{i:03d}" for i in range(LIST_MEMBERS_SHOWN + 5)]
    tokens = make_team(srv, "many-members", *names)
    with srv.client(tokens["w051"]) as c:
        c.post("/v1/sessions", json={"session_id": "w051-1"}).raise_for_status()
    async with connect("http", srv, tokens["w000"], None, errlog) as s:
        seen: list[str] = []
        args: dict[str, object] = {}
        while True:
            listed, data = await ok(s, "list_members", **args)
            lines = listed.splitlines()
            assert len(data["members"]) <= LIST_MEMBERS_SHOWN
            seen += [m["name"] for m in data["members"]]
            if data["next_after"] is None:
                assert not any("More follow" in line for line in lines)
                break
            assert lines[-1] == (
                f'More follow: call list_members(after="{data["next_after"]}") for the next page.'
            )
            args = {"after": data["next_after"]}
        assert "- w051, llm; sessions: w051-1 (idle)" in listed  # its sessions, on its page
    assert seen == sorted([*names, "user"])


async def test_list_timers_answers_a_bounded_page_and_reads_on_past_it(
    srv: Server, errlog: TextIO
) -> None:
    """A busy team's pending timers (each member may hold a hundred) are not all poured
    into the model's context: an answer shows at most LIST_TIMERS_SHOWN, in the order
    they were set with the caller's own marked, and says how to read the next page; the
    pages together list every timer once, and ``member`` lists the caller's own."""
    from backchannel.interfaces.mcp import LIST_TIMERS_SHOWN

    tokens = make_team(srv, "many-timers", "a", "b", "c")
    every: list[int] = []
    for name in ("b", "c"):
        with srv.client(tokens[name]) as c:
            c.post("/v1/sessions", json={"session_id": f"{name}-1"}).raise_for_status()
            for i in range(LIST_TIMERS_SHOWN):
                body = {"intent": "anchor", "minutes": 60, "note": f"{name}'s task {i}"}
                every.append(c.post("/v1/timers", json=body).json()["timer_id"])
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
        mine = [
            c.post(
                "/v1/timers", json={"intent": "anchor", "minutes": 30, "note": f"mine {i}"}
            ).json()["timer_id"]
            for i in range(3)
        ]
    every += mine
    async with connect("http", srv, tokens["a"], "a-1", errlog) as s:
        seen: list[int] = []
        args: dict[str, object] = {}
        while True:
            listed, data = await ok(s, "list_timers", **args)
            lines = listed.splitlines()
            assert len(data["timers"]) <= LIST_TIMERS_SHOWN
            seen += [t["timer_id"] for t in data["timers"]]
            if data["next_after"] is None:
                assert not any("More follow" in line for line in lines)
                break
            after = data["next_after"]
            assert lines[-1] == (f"More follow: call list_timers(after={after}) for the next page.")
            args = {"after": after}
        assert seen == every, "every timer once, in the order set"
        for i, (line, t) in enumerate(zip(lines[-3:], mine, strict=True)):
            assert line.startswith(f"{t}: anchor for a (session a-1, yours), due in 1")
            assert line.endswith(f" s: mine {i}")
        _, data = await ok(s, "list_timers", member="a")
        assert [t["timer_id"] for t in data["timers"]] == mine and data["next_after"] is None
        _, data = await ok(s, "list_timers", member="b", after=every[LIST_TIMERS_SHOWN - 2])
        assert [t["timer_id"] for t in data["timers"]] == [every[LIST_TIMERS_SHOWN - 1]]
        none, _ = await ok(s, "list_timers", after=mine[-1])
        assert none == f"No more pending timers of your team after timer {mine[-1]}."


class _Gated:
    """A member's client whose inbox calls stop at ``point`` (``("receive", n)``: before
    the n-th receive; ``("ack", n)``: after the n-th ack reached the hub) until ``go``:
    where a client's ``notifications/cancelled`` may find a ``check_inbox``."""

    def __init__(self, client: Any, point: tuple[str, int]) -> None:
        self._client = client
        self.point = point
        self.counts = {"receive": 0, "ack": 0}
        self.stopped = asyncio.Event()
        self.go = asyncio.Event()
        self.cancelled = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def _gate(self, call: str) -> None:
        self.counts[call] += 1
        if (call, self.counts[call]) == self.point:
            self.stopped.set()
            try:
                await self.go.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise

    async def receive(self, **kw: Any) -> Any:
        await self._gate("receive")
        return await self._client.receive(**kw)

    async def ack(self, ids: Any) -> Any:
        acked = await self._client.ack(ids)
        await self._gate("ack")
        return acked


@pytest.mark.parametrize(
    ("transport", "named"), [("stdio", True), ("http", True), ("stdio", False)]
)
async def test_a_check_inbox_mid_turn_says_what_waits_for_the_turn_to_end(
    srv: Server, errlog: TextIO, transport: str, named: bool
) -> None:
    """A message pinned to the session (a linked peer's reply, a fired timer) is handed
    over only between turns: a model polling ``check_inbox`` mid-turn for it is told to
    end its turn, not that nothing came, whether the server was given its session or
    not (as the CLIs attached by ``backchannel attach`` run it); the message waits, and
    the turn's end hands it over."""
    team = f"midturn-{transport}-{named}"
    tokens = make_team(srv, team, "a:claude-code", "b")
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
    async with connect(transport, srv, tokens["a"], "a-1" if named else None, errlog) as s:
        assert (await ok(s, "check_inbox"))[0] == "No new messages."  # between turns
        with srv.client(tokens["a"]) as c:
            c.post("/v1/sessions/a-1/events", json={"kind": "turn_start"}).raise_for_status()
        with srv.client(tokens["b"]) as c:
            body = {"to": "a", "session": "a-1", "text": "the reply you wait for"}
            c.post("/v1/messages", json=body).raise_for_status()
        said, data = await ok(s, "check_inbox")
        assert said == NOTHING_MID_TURN
        assert data == {"text": NOTHING_MID_TURN, "messages": [], "turn_running": True}
        with srv.client(tokens["a"]) as c:
            body = {"kind": "agent_stop", "text": "done"}
            c.post("/v1/sessions/a-1/events", json=body).raise_for_status()
    with srv.client(tokens["a"]) as c:  # the turn ended: it is handed over (the hook's)
        got = c.post("/v1/inbox/receive", json={"session": "a-1"}).json()["messages"]
        assert [m["text"] for m in got] == ["the reply you wait for"]


@pytest.mark.parametrize("point", [("receive", 2), ("ack", 1)])
async def test_a_check_inbox_the_client_cancels_loses_nothing_and_shows_nothing_twice(
    srv: Server, point: tuple[str, int]
) -> None:
    """The client cancels ``check_inbox`` (``notifications/cancelled``: the user pressed
    Esc) between its two receives (the session's, the member's), or just after an ack
    reached the hub: a cancelled call is never answered, so what it took must be the
    next call's at once, neither acked unseen nor held for the lease's minute; and
    whatever was answered is shown once."""
    from backchannel.client import Client
    from backchannel.interfaces import mcp

    team = f"cancel-{point[0]}"
    tokens = make_team(srv, team, "a", "b")
    with srv.client(tokens["a"]) as c:  # a's runtime opened a session, between turns
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
    with srv.client(tokens["b"]) as c:
        c.post("/v1/messages", json={"to": "a", "text": "read me once"}).raise_for_status()
    async with Client(srv.url, tokens["a"]) as client:
        gated = _Gated(client, point)
        agent = mcp.Agent(gated, team, "a", "a-1")  # type: ignore[arg-type]

        async with memory_session(agent, delegate=False) as s:
            call = asyncio.create_task(s.call_tool("check_inbox", {}))
            stopped = asyncio.create_task(gated.stopped.wait())
            await asyncio.wait({call, stopped}, timeout=30, return_when="FIRST_COMPLETED")
            shown: list[str] = []
            if call.done():  # answered before the point: no cancel to send
                assert not call.result().is_error, text(call.result())
                answer = call.result().structured_content
                shown += [answer["text"]] if answer["messages"] else []
            else:
                assert gated.stopped.is_set()
                call.cancel()  # the SDK tells the server: notifications/cancelled
                with pytest.raises(asyncio.CancelledError):
                    await call
            stopped.cancel()
            gated.go.set()
            # given back at once: well within the lease's 60 s
            async with asyncio.timeout(20):
                while not shown:
                    _, data = await ok(s, "check_inbox")
                    shown += [data["text"]] if data["messages"] else []
            assert len(shown) == 1 and "] read me once\n" in shown[0], shown
            _, data = await ok(s, "check_inbox")
            assert data["messages"] == []


async def test_an_http_check_inbox_whose_client_hangs_up_gives_back_what_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over HTTP ``/mcp`` the client hangs up while ``check_inbox`` runs (killed, or gave
    up waiting): its answer can reach nobody, so what the call took is the next
    receive's at once, neither acked unseen nor held for the lease's minute."""
    import uvicorn

    from backchannel.interfaces import agents_http
    from backchannel.interfaces.http import create_app
    from backchannel.interfaces.mcp import Agent
    from backchannel.testing.waiting import eventually

    gates: list[_Gated] = []
    resolve = agents_http.McpEndpoint._resolve

    async def gated(self: Any, ctx: Any) -> Any:
        agent = await resolve(self, ctx)
        gates.append(_Gated(agent.client, ("receive", 2)))
        return Agent(gates[-1], agent.team, agent.name, agent.session)

    monkeypatch.setattr(agents_http.McpEndpoint, "_resolve", gated)
    hub = Hub(SqliteStore(tmp_path / "hub.db"))
    app = create_app(hub, "admin-token")
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started, what="the hub to listen")
        port = server.servers[0].sockets[0].getsockname()[1]
        await hub.create_team("t")
        a = (await hub.add_member("t", "a"))[1]
        b = (await hub.add_member("t", "b"))[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            auth = {"Authorization": f"Bearer {a}"}
            r = await http.post("/v1/sessions", json={"session_id": "a-1"}, headers=auth)
            r.raise_for_status()
            r = await http.post(
                "/v1/messages",
                json={"to": "a", "text": "read me once"},
                headers={"Authorization": f"Bearer {b}"},
            )
            r.raise_for_status()
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
        call["params"] = {"name": "check_inbox", "arguments": {}}
        headers = {
            **auth,
            "Backchannel-Session": "a-1",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        }
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            posting = asyncio.create_task(http.post("/mcp", json=call, headers=headers))
            await eventually(lambda: gates and gates[0].stopped.is_set(), what="the call")
            posting.cancel()  # the client hangs up
            with contextlib.suppress(asyncio.CancelledError):
                await posting
        # the hub sees the connection close and stops the call; else it goes on
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await gates[0].cancelled.wait()
        gates[0].go.set()
        async with Client(f"http://127.0.0.1:{port}", a) as client:
            got: list[Any] = []
            async with asyncio.timeout(20):  # given back at once: well within 60 s
                while not got:
                    got = await client.receive(wait=1)
            assert [m.text for m in got] == ["read me once"]
    finally:
        server.should_exit = True
        await serving
        await hub.close()


async def test_check_inbox_says_when_more_messages_wait_than_it_shows(
    srv: Server, errlog: TextIO
) -> None:
    """``check_inbox`` reads a bounded batch; when more wait than it showed, its answer
    says so and how to read them (the model is never left thinking it read them all).
    Each answer, its text and its structured content together, stays within
    ANSWER_BYTES, which Codex keeps whole."""
    from backchannel.interfaces.mcp import ANSWER_BYTES, CHECK_INBOX_BATCH

    tokens = make_team(srv, "deep-inbox", "a")
    total = CHECK_INBOX_BATCH + 7
    with srv.client(tokens["user"]) as c:
        for i in range(total):
            c.post("/v1/messages", json={"to": "a", "text": f"note {i}"}).raise_for_status()
    async with connect("http", srv, tokens["a"], None, errlog) as s:
        read: list[str] = []
        answers = []
        while True:
            shown, data = await ok(s, "check_inbox")
            if not data["messages"]:
                assert shown == "No new messages."
                break
            n = len(data["messages"])
            answers.append(n)
            read += [line for line in shown.split("\n") if line.startswith("[From user]")]
            assert shown.startswith(f"{n} new message")
            assert len(shown.encode()) + len(json.dumps(data["messages"])) <= ANSWER_BYTES
            if data.get("more"):
                assert shown.endswith(
                    "More messages may wait: call check_inbox again to read them."
                )
            else:
                assert "More messages may wait" not in shown
        assert len(answers) >= 2 and sum(answers) == total, answers
        assert read == [f"[From user] note {i}" for i in range(total)]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_check_inbox_shows_each_message_once_to_a_client_that_shows_structured_content(
    srv: Server, errlog: TextIO, transport: str
) -> None:
    """Claude Code and Codex show the model a tool's structured content, not its text:
    check_inbox's carried each message twice, framed in its ``text`` and raw in its
    ``messages``, so the model read every message twice (and a long one's first part
    twice, past a client's cap). The structured content now names the messages and
    holds their text once, in ``text``, as ``read_message``'s does."""
    tokens = make_team(srv, f"once-{transport}", "a")
    texts = ["MARK-ONE the first", "MARK-TWO the\nsecond", "MARK-LONG " + "y" * 35_000]
    with srv.client(tokens["user"]) as c:
        for body in texts:
            c.post("/v1/messages", json={"to": "a", "text": body}).raise_for_status()
    async with connect(transport, srv, tokens["a"], None, errlog) as s:
        shown: list[str] = []
        async with asyncio.timeout(30):
            while len(shown) < len(texts):
                result = await s.call_tool("check_inbox", {})
                answer = result.structured_content
                assert answer is not None and answer["text"] == text(result)
                seen = json.dumps(answer, ensure_ascii=False)
                for mark in ("MARK-ONE", "MARK-TWO", "MARK-LONG"):
                    assert seen.count(mark) <= 1, seen[:500]  # once, in text
                assert "y" * 1000 not in seen.partition('"messages"')[2], seen[-500:]
                shown += [m["message_id"] for m in answer["messages"]]
        long = [m for m in answer["messages"] if "parts" in m]
        assert long and long[0]["part"] == 1 and "text" not in long[0]


async def test_check_inbox_answers_whole_messages_within_its_room_and_gives_back_the_rest(
    srv: Server, errlog: TextIO
) -> None:
    """A client cuts or refuses a tool answer past its limit (Claude Code: 25,000
    tokens), and ``check_inbox`` acks what it answered with: it answers only the whole
    messages that fit in ANSWER_BYTES, gives the rest back and says more may wait;
    the next call reads them. Nothing is acked unseen."""
    from backchannel.interfaces.mcp import ANSWER_BYTES

    tokens = make_team(srv, "long-inbox", "a")
    size = ANSWER_BYTES * 4 // 10  # two fit in one answer, three do not
    texts = [f"part {i} " + chr(ord("a") + i) * size for i in range(3)]
    with srv.client(tokens["user"]) as c:
        for text in texts:
            c.post("/v1/messages", json={"to": "a", "text": text}).raise_for_status()
    async with connect("http", srv, tokens["a"], None, errlog) as s:
        first, data = await ok(s, "check_inbox")
        assert first.startswith("2 new messages:") and data["more"] is True
        assert texts[0] in first and texts[1] in first and "part 2" not in first
        assert len(data["messages"]) == 2 and data["text"] == first
        rest, data = await ok(s, "check_inbox")
        assert rest.startswith("1 new message:") and texts[2] in rest and "more" not in data
        assert (await ok(s, "check_inbox"))[0] == "No new messages."
    with srv.client(tokens["a"]) as c:
        assert c.get("/v1/inbox/pending").json()["pending"] == 0


async def test_messages_check_inbox_gives_back_keep_their_attempts(
    srv: Server, errlog: TextIO
) -> None:
    """Messages that wait behind long ones are leased a few at a time, not all at once
    and given back at every call: each is handed out at most twice before it is read,
    so one that waited behind many long messages keeps its retries (a lease that runs
    out after its last attempt makes it a dead letter)."""
    from backchannel.interfaces.mcp import ANSWER_BYTES

    tokens = make_team(srv, "long-queue", "a")
    size = ANSWER_BYTES * 3 // 10  # three to an answer
    ids = []
    with srv.client(tokens["user"]) as c:
        for i in range(30):
            r = c.post("/v1/messages", json={"to": "a", "text": f"m{i} " + "x" * size})
            ids.append(r.json()["message_id"])
    read = []
    async with connect("http", srv, tokens["a"], None, errlog) as s:
        for _ in range(30):
            _, data = await ok(s, "check_inbox")
            if not data["messages"]:
                break
            read += [m["message_id"] for m in data["messages"]]
    assert read == ids
    with srv.client(tokens["user"]) as c:
        attempts = [c.get(f"/v1/messages/{mid}").json()["deliveries"][0]["attempts"] for mid in ids]
    assert max(attempts) <= 2, attempts
