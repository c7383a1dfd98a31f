"""``/mcp`` under revocation: a session of the official MCP client, opened over
streamable HTTP with a member token, loses every power once the token is rotated or its
member removed, on the same open session: each call is refused with the reason, and
nothing is sent, received or leased by it. A token acts only as its own member."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from backchannel.interfaces.agents_http import SESSION_HEADER as SESSION
from tests.conftest import Server, start_server
from tests.runtimes.agents import http_mcp, make_team, text


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("mcp-revoked") / "home")
    try:
        yield s
    finally:
        s.stop()


def _inbox(srv: Server, token: str) -> list[dict[str, Any]]:
    with srv.client(token) as c:
        r = c.get("/v1/inbox", params={"limit": 50})
        r.raise_for_status()
        got: list[dict[str, Any]] = r.json()["messages"]
        return got


async def _refused(session: Any, tool: str, args: dict[str, Any]) -> str:
    """What the client is told when ``tool`` is called on ``session``."""
    try:
        result = await session.call_tool(tool, args)
    except MCPError as exc:
        return f"raised MCPError: {exc}"
    return f"error={result.is_error} {text(result)}"


@pytest.mark.parametrize("how", ["rotate", "remove"])
async def test_an_open_mcp_session_loses_a_revoked_token(srv: Server, how: str) -> None:
    team = f"revoked-{how}"
    tokens = make_team(srv, team, "a", "b")
    with srv.client(tokens["b"]) as c:
        c.post("/v1/messages", json={"to": "a", "text": "for a"}).raise_for_status()
    async with http_mcp(srv.url, tokens["a"]) as s:
        assert "b" in text(await s.call_tool("list_members", {}))
        with srv.client() as admin:
            if how == "rotate":
                r = admin.post(f"/v1/teams/{team}/members/a/token")
            else:
                r = admin.delete(f"/v1/teams/{team}/members/a")
            r.raise_for_status()
        new = r.json().get("token")
        for tool, args in (
            ("send_message", {"to": "b", "message": "after revocation"}),
            ("check_inbox", {}),
            ("list_members", {}),
            ("set_timer", {"intent": "anchor", "minutes": 5, "note": "x"}),
        ):
            said = await _refused(s, tool, args)
            assert said.startswith("raised MCPError"), (tool, said)
            # the hub's reason, not the client's stand-in for a bare 401
            assert "rotated or its member removed" in said, (tool, said)
    assert [m["text"] for m in _inbox(srv, tokens["b"]) if m["from"] == "a"] == []
    if new:  # nothing was leased: the first hand-over is the message's first attempt
        waiting = _inbox(srv, new)
        assert [(m["text"], m["attempt"]) for m in waiting] == [("for a", 1)]


async def test_a_session_of_one_member_is_not_acted_for_with_anothers_token(srv: Server) -> None:
    """``Backchannel-Session`` names the session the tools act for; b's token naming a's
    session sends nothing as a, reads nothing of a's and sets no timer on a's session.
    ``/mcp`` is stateless: an ``Mcp-Session-Id`` with no token is refused like any
    request without one."""
    tokens = make_team(srv, "sessions-own", "a", "b", "c")
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
    with srv.client(tokens["c"]) as c:
        c.post("/v1/messages", json={"to": "a", "text": "for a"}).raise_for_status()
    async with http_mcp(srv.url, tokens["b"], session="a-1") as s:
        said = await _refused(s, "send_message", {"to": "c", "message": "as if from a"})
        assert "error=True" in said and "'b' has no session 'a-1'" in said, said
        said = await _refused(s, "set_timer", {"intent": "anchor", "minutes": 5, "note": "x"})
        assert "error=True" in said and "belongs to 'a', not 'b'" in said, said
        said = await _refused(s, "check_inbox", {})
        assert "for a" not in said, said
    assert _inbox(srv, tokens["c"]) == []
    assert [(m["text"], m["attempt"]) for m in _inbox(srv, tokens["a"])] == [("for a", 1)]
    call = {"name": "list_members", "arguments": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
    headers = {"Accept": "application/json, text/event-stream", "Mcp-Session-Id": "a-1"}
    async with httpx.AsyncClient(base_url=srv.url) as h:
        r = await h.post("/mcp", json=body, headers={**headers, SESSION: "a-1"})
    assert r.status_code == 401, r.text
