"""Helpers for the push adapter tests (imported explicitly; ``conftest.py`` is the inbox
writer's): a real hub, bounded waits, a local HTTP endpoint, a private tmux server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import libtmux
import pytest

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core.delegation import RetryPolicy
from backchannel.delivery.dispatcher import Dispatcher
from backchannel.hub import Hub
from backchannel.testing import MemoryStore, eventually

SECRET = "adapter-test-secret"
FAST_RETRY = RetryPolicy(start=0.05, factor=2.0, cap=0.2, budget=5.0, timeout=5.0)


async def state_of(hub: Hub, team: str, message_id: str) -> str:
    return (await hub.message_status(team, message_id)).state.value


async def wait_state(hub: Hub, team: str, message_id: str, state: str, within: float = 10) -> Any:
    async def check() -> Any:
        st = await hub.message_status(team, message_id)
        return st if st.state.value == state else None

    return await eventually(check, within=within, what=f"{message_id} to be {state}")


@asynccontextmanager
async def running_hub(
    services: dict[str, str] | None = None,
    *,
    tokens: dict[str, str] | None = None,
    retry: RetryPolicy = FAST_RETRY,
    max_attempts: int = 3,
    lease_seconds: float = 30.0,
) -> AsyncIterator[Hub]:
    """A real in-process hub (memory store, real clock, maintenance running) with a
    callback registry of ``name -> url`` and a team ``t`` without the anchor rule."""
    tokens = tokens or {}
    callbacks = CallbackConfig(
        secret=SECRET,
        services={n: Service(n, u, tokens.get(n)) for n, u in (services or {}).items()},
        retry=retry,
    )
    # these tests store settings on purpose that only their own adapters (or the
    # dispatcher's delivery-time checks) handle
    hub = Hub(
        MemoryStore(),
        callbacks=callbacks,
        lease_seconds=lease_seconds,
        max_attempts=max_attempts,
        check_delivery=False,
    )
    async with hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        yield hub


def same_size_in_place(
    path: Path, changes: dict[bytes, bytes], *, mtime_moves: bool = True
) -> None:
    """Rewrite ``path`` in place (its inode kept) with ``changes`` of equal length, and
    move its mtime a second on, as a writer that does not rename would (with
    ``mtime_moves`` False, leave the times as the file system's clock sets them)."""
    st, data = path.stat(), path.read_bytes()
    for old, new in changes.items():
        assert len(old) == len(new)
        data = data.replace(old, new)
    with open(path, "r+b") as f:
        f.write(data)
    if mtime_moves:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def written_long_ago(path: Path) -> None:
    """Move ``path``'s mtime a minute back: a file last changed well before it is read,
    whose stamp a reader may keep (``claude_inbox.stamp_settled``)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 60_000_000_000))


def frozen_fs_clock(stamp_of: Callable[[Path | str], Any]) -> Callable[[Path | str], Any]:
    """``file_stamp`` on a file system whose clock has not moved since this call (one
    tick that lasts, as a coarse clock's does between two quick writes): every file's
    modification and change times read as now."""
    tick = time.time_ns()

    def stamp(path: Path | str) -> Any:
        got = stamp_of(path)
        return None if got is None else (*got[:3], tick, tick)

    return stamp


@asynccontextmanager
async def dispatching(hub: Hub, **options: Any) -> AsyncIterator[Dispatcher]:
    options.setdefault("rescan_s", 0.1)
    options.setdefault("grace_s", 2.0)
    d = Dispatcher(hub, **options)
    await d.start()
    try:
        yield d
    finally:
        await d.stop()


# -- a local HTTP endpoint ---------------------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


#: Decides the answer to one request: (status, body bytes, extra headers).
Behaviour = Callable[[Seen, int], tuple[int, bytes, dict[str, str]]]


@dataclass
class Endpoint:
    """An HTTP server on 127.0.0.1 in threads; ``behaviour(request, n)`` answers the
    n-th request (0-based). ``release`` unblocks handlers that wait on it."""

    behaviour: Behaviour
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def count(self) -> int:
        return len(self.seen)


@contextmanager
def endpoint(behaviour: Behaviour) -> Iterator[Endpoint]:
    ep = Endpoint(behaviour)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length", "0"))
            req = Seen(
                self.path, {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(size)
            )
            with lock:
                n = len(ep.seen)
                ep.seen.append(req)
            status, body, headers = ep.behaviour(req, n)
            # a hub that gave up waiting (the timeout tests) has closed the connection:
            # the answer goes nowhere, which is no error of the test's
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    ep.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield ep
    finally:
        ep.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def answer(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Behaviour:
    return lambda req, n: (status, body, headers or {})


# -- a private tmux server ---------------------------------------------------------------


class TmuxServer(libtmux.Server):
    """A private tmux server whose ``new-session`` is made again when the server it starts
    dies while starting ("server exited unexpectedly": seen once, in a whole run on a
    loaded host). A fault of the rig's, not the adapter's, which never starts a server."""

    def new_session(self, *args: Any, **kwargs: Any) -> libtmux.Session:
        for attempt in range(3):
            try:
                return super().new_session(*args, **kwargs)
            except libtmux.exc.LibTmuxException as exc:
                if "server exited unexpectedly" not in str(exc) or attempt == 2:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")


@contextmanager
def tmux_server() -> Iterator[libtmux.Server]:
    """A real tmux server on its own socket (``tmux -L bc-test-...``), killed at the end."""
    if shutil.which("tmux") is None:
        pytest.fail("the tmux adapter tests need tmux on PATH (scripts/setup-system.sh)")
    server = TmuxServer(socket_name=f"bc-test-{uuid.uuid4().hex[:10]}", config_file="/dev/null")
    try:
        yield server
    finally:
        socket = server.socket_path
        if server.is_alive():
            socket = server.cmd("display-message", "-p", "#{socket_path}").stdout[0]
            server.kill()
        if socket:
            Path(socket).unlink(missing_ok=True)
