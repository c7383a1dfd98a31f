"""A stand-in for a runtime's process (Claude Code, Codex, Gemini CLI), for tests.

``python stand_in.py BIN TEAM/MEMBER URL [SETUP]``: it starts ``BIN mcp`` as its child
with its stdin and stdout on pipes, as the runtimes start a stdio MCP server, waits for
it to answer a tool call, and keeps it for as long as it runs. ``SETUP`` says how:

* ``stdio`` (the default): directly, as ``backchannel attach`` configures it;
* ``wrapper``: through a shell script that runs it (without ``exec``), as a user's own
  launcher does; ``timeout``: through ``timeout``, a launcher that stays as its parent;
* ``http``: no MCP server process at all (the runtime's MCP client talks to the hub's
  ``/mcp``, ``attach --http``), and hooks run with ``--keep-alive``, as ``attach
  --http`` writes them.

For each hook payload (one JSON line) written to its stdin, it runs ``BIN hook
claude-code`` through ``sh -c``, as the runtimes run command hooks, and writes the
hook's answer as one JSON line to its stdout. Between lines it is idle, as a
runtime at its prompt or in a long tool call is: no event at all.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile


def ready(mcp: subprocess.Popen[str]) -> None:
    """The MCP handshake and one tool call: once it is answered, the server is up (and
    beating), not just its front (:mod:`backchannel.interfaces.mcp_front`)."""
    assert mcp.stdin is not None and mcp.stdout is not None
    hello = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "stand-in", "version": "0"},
    }
    for msg in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_members"}},
    ):
        mcp.stdin.write(json.dumps(msg) + "\n")
    mcp.stdin.flush()
    while json.loads(mcp.stdout.readline()).get("id") != 2:
        pass


def launcher(setup: str) -> list[str]:
    """The command that runs ``backchannel mcp`` for ``setup`` (see the docstring)."""
    if setup == "timeout":
        return ["timeout", "3600"]
    if setup == "wrapper":
        where = os.path.dirname(os.environ.get("BACKCHANNEL_STATE_DIR", "")) or None
        fd, path = tempfile.mkstemp(prefix="bc-mcp-wrapper-", suffix=".sh", dir=where)
        os.write(fd, b'#!/bin/sh\n"$@"\n')
        os.close(fd)
        os.chmod(path, 0o700)
        return [path]
    return []


def main() -> None:
    bin_, who, url = sys.argv[1:4]
    setup = sys.argv[4] if len(sys.argv) > 4 else "stdio"
    mcp = None
    if setup != "http":
        mcp = subprocess.Popen(
            [*launcher(setup), bin_, "mcp", "--as", who, "--url", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready(mcp)
    extra = ["--keep-alive"] if setup == "http" else []
    hook = " ".join(
        shlex.quote(p) for p in [bin_, "hook", "claude-code", "--as", who, "--url", url, *extra]
    )
    for line in sys.stdin:
        run = subprocess.run(
            ["sh", "-c", hook], input=line, capture_output=True, text=True, check=False
        )
        answer = json.loads(run.stdout) if run.stdout.strip() else {}
        print(json.dumps({"answer": answer, "stderr": run.stderr}), flush=True)
    if mcp is not None:
        mcp.stdin.close()  # type: ignore[union-attr]
        mcp.wait()


if __name__ == "__main__":
    main()
