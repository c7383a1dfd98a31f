"""``backchannel mcp`` ready at once: a front that answers the MCP handshake while the
real server loads.

A runtime starts the MCP server and, often without waiting long, asks it for its tools;
loading the MCP SDK, pydantic and the HTTP client takes a second or more. This front
imports only the standard library. It answers ``initialize`` (for the protocol versions
the SDK negotiates by handshake), ``tools/list`` and ``ping`` from ``mcp_wire.json``, and
declines ``server/discover`` as the server does (see :func:`.mcp.build_server`),
exactly what the SDK server answers (a test compares the two, and
``python -m backchannel.interfaces.mcp_front --write`` regenerates the file), while a
thread loads the real server (:func:`backchannel.interfaces.mcp.serve_stdio`). Once it is
up, the front replays the handshake to it (its answer to the replay is dropped) and
everything else the client sent, in order, then passes every line through both ways.
Anything the front does not answer itself (another protocol version, a batch, a tool
call) simply waits for the real server.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

WIRE = Path(__file__).with_name("mcp_wire.json")
REPLAY_ID = "backchannel-front-initialize"
_OPTIONS = {"--as": "as", "--url": "url", "--token": "token", "--home": "home"}
_OPTIONS["--session"] = "session"


def _parse(argv: Sequence[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    args = list(argv)
    while args:
        key, eq, value = args.pop(0).partition("=")
        if key not in _OPTIONS:
            return None  # --help, a typo, anything else: the full CLI says what is wrong
        if not eq:
            if not args:
                return None
            value = args.pop(0)
        out[_OPTIONS[key]] = value
    return out


def _running_server(opts: dict[str, str]) -> str | None:
    """The URL a live ``backchannel serve`` recorded in the data directory, if any."""
    home = Path(opts.get("home") or os.environ.get("BACKCHANNEL_HOME") or ".backchannel")
    try:
        info = json.loads((home.absolute() / "server.json").read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    url = info.get("url")
    return url if isinstance(url, str) else None


class Front:
    """The client's side of the wire until the real server takes over."""

    def __init__(self, wire: dict[str, Any], out: BinaryIO) -> None:
        self._wire = wire
        self._out = out
        self._lock = threading.Lock()
        self._replay: list[str] = []
        self._pending: list[str] = []
        self._eof = False
        self._sink: Callable[[str | None], None] | None = None

    def write(self, line: str) -> None:
        """One JSON-RPC message to the client (called from either thread)."""
        with self._lock:
            self._out.write(line.rstrip("\n").encode("utf-8") + b"\n")
            self._out.flush()

    def _send(self, message: dict[str, Any]) -> None:
        self._out.write(json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n")
        self._out.flush()

    def received(self, line: str | None) -> None:
        """A line from the client (``None``: its end of the wire closed)."""
        with self._lock:
            if self._sink is not None:
                self._sink(line)
            elif line is None:
                self._eof = True
            elif self._pending or not self._answer(line):
                self._pending.append(line)

    def attach(self, sink: Callable[[str | None], None]) -> None:
        """The real server is up: it gets the handshake, then what waited, then the rest."""
        with self._lock:
            for line in (*self._replay, *self._pending):
                sink(line)
            if self._eof:
                sink(None)
            self._pending.clear()
            self._sink = sink

    def _answer(self, line: str) -> bool:
        try:
            line.encode("utf-8")  # bytes that were not UTF-8 (escaped): the server refuses
            msg = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past the stack
            return False
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            return False
        if msg.get("method") == "notifications/initialized" and self._replay:
            self._replay.append(line)
            return True
        if "id" not in msg:
            return False
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "server/discover" and not self._replay:
            # declined, as the server itself declines it: a handshake-era connection is
            # the one on which Claude Code takes channel notifications
            error = {"code": -32601, "message": "Method not found"}
            self._send({"jsonrpc": "2.0", "id": msg["id"], "error": error})
            return True
        if method == "initialize" and not self._replay and _well_formed(params):
            result = self._wire["initialize"].get(params.get("protocolVersion"))
            if result is None:
                return False  # a version the front does not know: the SDK negotiates
            self._replay.append(json.dumps({**msg, "id": REPLAY_ID}))
            self._send({"jsonrpc": "2.0", "id": msg["id"], "result": result})
            return True
        if method == "tools/list" and self._replay and not (params or {}).get("cursor"):
            self._send({"jsonrpc": "2.0", "id": msg["id"], "result": self._wire["tools/list"]})
            return True
        if method == "ping":
            self._send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
            return True
        return False


def _well_formed(params: Any) -> bool:
    """An ``initialize`` the SDK accepts as it is; any other the SDK answers itself."""
    if not isinstance(params, dict):
        return False
    info = params.get("clientInfo")
    return (
        isinstance(params.get("protocolVersion"), str)
        and isinstance(params.get("capabilities"), dict)
        and isinstance(info, dict)
        and isinstance(info.get("name"), str)
        and isinstance(info.get("version"), str)
    )


class _Lines:
    """The real server's stdin: an async iterator over the lines the front passes on."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        line = await self.queue.get()
        if line is None:
            raise StopAsyncIteration
        return line


class _Out:
    """The real server's stdout: to the client, less the answer to the replayed handshake."""

    def __init__(self, front: Front) -> None:
        self._front = front

    async def write(self, text: str) -> None:
        if REPLAY_ID in text and json.loads(text).get("id") == REPLAY_ID:
            return
        self._front.write(text)

    async def flush(self) -> None:
        pass


async def _serve(front: Front, opts: dict[str, str]) -> None:
    from backchannel.client import Client
    from backchannel.interfaces.mcp import serve_stdio

    client = Client(opts["target"], opts["token"])
    lines = _Lines()
    loop = asyncio.get_running_loop()

    def sink(line: str | None) -> None:
        loop.call_soon_threadsafe(lines.queue.put_nowait, line)

    front.attach(sink)
    expect = tuple(opts["as"].split("/", 1)) if opts.get("as") else ()
    session = opts.get("session") or os.environ.get("BACKCHANNEL_SESSION") or None
    await serve_stdio(client, session=session, expect=expect, streams=(lines, _Out(front)))


def _background(front: Front, opts: dict[str, str], done: threading.Event) -> None:
    import logging

    from backchannel.errors import BackchannelError

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    try:
        asyncio.run(_serve(front, opts))
    except BackchannelError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        os._exit(1)  # the client reads EOF on stdout and reports the server as failed
    except BaseException as exc:
        print(f"error: the MCP server failed: {exc!r}", file=sys.stderr, flush=True)
        os._exit(1)
    finally:
        done.set()


def run(argv: Sequence[str]) -> bool:
    """Serve ``backchannel mcp`` here if it can be; False hands it to the full CLI."""
    opts = _parse(argv)
    if opts is None:
        return False
    token = opts.get("token") or os.environ.get("BACKCHANNEL_TOKEN")
    if not token:
        return False  # the full CLI explains
    opts["token"] = token
    target = opts.get("url") or os.environ.get("BACKCHANNEL_URL") or _running_server(opts)
    if not target:
        return False  # no hub named or running: the full CLI says where to find one
    opts["target"] = target
    front = Front(json.loads(WIRE.read_text()), sys.stdout.buffer)
    done = threading.Event()
    worker = threading.Thread(
        target=_background, args=(front, opts, done), name="bc-mcp", daemon=True
    )
    worker.start()
    stdin = sys.stdin.buffer
    for raw in iter(stdin.readline, b""):
        front.received(raw.decode("utf-8", "surrogateescape"))  # refused, not mangled
    front.received(None)
    done.wait(10.0)
    return True


def write_wire() -> None:
    """Regenerate ``mcp_wire.json`` from the real server."""
    from backchannel.interfaces.mcp import wire_snapshot

    WIRE.write_text(json.dumps(asyncio.run(wire_snapshot()), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_wire()
        print(f"wrote {WIRE}")
    else:
        print("usage: python -m backchannel.interfaces.mcp_front --write", file=sys.stderr)
        raise SystemExit(2)
