"""Helpers for tests that drive agents against a real server: the official MCP client
over stdio and streamable HTTP, hook calls as the runtimes make them."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import httpx
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CallToolResult, TextContent

from tests.conftest import BIN, Server


def make_team(srv: Server, team: str, *members: str, **settings: Any) -> dict[str, str]:
    """A team (anchor policy as given, else off) and its members' tokens."""
    with srv.client() as c:
        body = {"name": team, "settings": {"anchor_policy": "off", **settings}}
        r = c.post("/v1/teams", json=body)
        r.raise_for_status()
        tokens = {"user": r.json()["user_token"]}
        for m in members:
            name, _, kind = m.partition(":")
            r = c.post(f"/v1/teams/{team}/members", json={"name": name, "kind": kind or "llm"})
            r.raise_for_status()
            tokens[name] = r.json()["token"]
    return tokens


@asynccontextmanager
async def http_mcp(
    url: str, token: str, session: str | None = None
) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    if session:
        headers["Backchannel-Session"] = session
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as s,
    ):
        await s.initialize()
        yield s


@asynccontextmanager
async def stdio_mcp(env: dict[str, str], errlog: TextIO) -> AsyncIterator[ClientSession]:
    # the code under test (a worktree's), not the one the command was installed from
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), **env}
    params = StdioServerParameters(command=str(BIN), args=["mcp"], env=env)
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as s,
    ):
        await s.initialize()
        yield s


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def hook_http(srv: Server, token: str, runtime: str, payload: Any) -> dict[str, Any]:
    """A runtime's HTTP hook call (Claude Code's ``http`` hook type)."""
    r = httpx.post(
        f"{srv.url}/v1/hooks/{runtime}",
        content=json.dumps(payload),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def hook_cmd(
    runtime: str,
    stdin: str,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """A runtime's command hook: the JSON on stdin, the answer on stdout."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    return subprocess.run(
        [str(BIN), "hook", runtime, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**full_env, **(env or {})},
        cwd=cwd,
        timeout=60,
    )


def memory_session(agent: Any, delegate: bool = True) -> Any:
    """A client session (an async context) of the MCP server run in this process for
    ``agent``, over memory streams."""
    import asyncio
    import contextlib

    from mcp.shared.memory import create_client_server_memory_streams

    from backchannel.interfaces import mcp

    async def resolve(ctx: Any) -> Any:
        return agent

    server = mcp.build_server(resolve, delegate=delegate)

    @contextlib.asynccontextmanager
    async def running() -> Any:
        async with create_client_server_memory_streams() as (client_streams, server_streams):
            task = asyncio.create_task(server.run(*server_streams, mcp.init_options(server)))
            try:
                async with ClientSession(*client_streams) as s:
                    await s.initialize()
                    yield s
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return running()
