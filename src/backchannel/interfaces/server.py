"""``backchannel serve``: the hub, its HTTP API and streams, on uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import faulthandler
import json
import logging
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from rich.console import Console
from rich.markup import escape

from backchannel import config
from backchannel.callbacks import CallbackConfig
from backchannel.delivery.adapters import register_checks
from backchannel.delivery.dispatcher import Dispatcher
from backchannel.delivery.inbox_watch import InboxBridge
from backchannel.delivery.ownership import OWNERSHIP_S
from backchannel.hub import Hub
from backchannel.interfaces import logs
from backchannel.interfaces.guard import ConnectionLimits, guarded_protocol
from backchannel.interfaces.http import create_app
from backchannel.interfaces.logs import LogFormat
from backchannel.tuning import tune_gc

log = logging.getLogger("backchannel.serve")


def _event_loop_kind() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def _add_metrics(app: FastAPI, hub: Hub, token: str) -> None:
    try:
        from backchannel.interfaces import metrics
    except ImportError:

        @app.get("/metrics", include_in_schema=False)
        async def no_metrics() -> JSONResponse:
            message = "metrics need the 'metrics' extra: pip install 'backchannel[metrics]'"
            return JSONResponse({"error": {"code": "not_installed", "message": message}}, 501)

        return
    metrics.install(app, hub, token)


def prepare_process() -> None:
    """What the hub's own process needs before it serves."""
    # A peer that hangs up makes a write fail with EPIPE on that one socket; with the
    # default SIGPIPE action (which the CLI sets for commands that print to pipes) it
    # would end the whole hub instead.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    faulthandler.enable()
    tune_gc()  # the process is the hub's: its collector runs as a busy hub needs


class _EndedByShutdown:
    """ASGI wrapper. At shutdown uvicorn waits a while (``timeout_graceful_shutdown``) for
    the requests under way, then cancels those still running: long-polls and event
    streams, which wait by design. Such a request then ends as an answer, not as a
    traceback in the log and a bare 500: a 503 that says the hub is stopping, or the end
    of a stream already under way. A cancellation while the server runs is not touched."""

    def __init__(self, app: Any, stopping: Callable[[], bool]) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not self.stopping():
                raise
            # uvicorn refuses a second response head (RuntimeError): a stream under way
            # is ended instead (nothing is tracked on the way, so a request costs nothing)
            with contextlib.suppress(OSError, RuntimeError):
                try:
                    await send(_STOPPING_START)
                except RuntimeError:
                    await send({"type": "http.response.body", "body": b""})
                else:
                    await send({"type": "http.response.body", "body": _STOPPING_BODY})


_STOPPING_BODY = json.dumps(
    {
        "error": {
            "code": "unavailable",
            "message": "the hub is shutting down; retry once it is back",
        }
    }
).encode()
_STOPPING_START = {
    "type": "http.response.start",
    "status": 503,
    "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_STOPPING_BODY)).encode()),
        (b"retry-after", b"5"),
        (b"connection", b"close"),
    ],
}


class _Say:
    """``console.print`` for what ``serve`` tells its terminal or log file, which may not
    take it: written to a file on a full disk (or a closed pipe), a print that fails is
    dropped, and the hub serves on. Raised, it ended the hub as it started (its banner)
    or made a clean stop exit 1. The log's own records already go on so (``logging``
    drops a record it cannot write)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, *objects: Any, **options: Any) -> None:
        try:
            self.console.print(*objects, **options)
        except OSError:
            with contextlib.suppress(OSError, ValueError):
                self.console.file.flush()  # what the failed write left in the buffer


def run_server(
    *,
    data_dir: Path,
    store_url: str,
    host: str,
    port: int,
    lease_seconds: float,
    max_attempts: int,
    max_text: int,
    console: Console,
    dispatch: bool = True,
    dispatch_lease: float = OWNERSHIP_S,
    retention_seconds: float | None = None,
    log_format: LogFormat = "text",
    limits: ConnectionLimits | None = None,
    pg_heartbeat: float | None = None,
    pg_frozen_after: float | None = None,
) -> None:
    """Serve until SIGINT, SIGTERM or SIGHUP. Raises ``StoreError`` if the store cannot be
    opened. Whatever ends the process is logged with its cause: a signal by name, an
    exception with its traceback, a fatal signal (SIGSEGV, SIGABRT...) by faulthandler."""
    logs.configure(log_format)
    prepare_process()
    say = _Say(console)
    token = config.admin_token(data_dir)
    assert token is not None
    store = config.open_store(store_url, pg_heartbeat=pg_heartbeat, pg_frozen_after=pg_frozen_after)
    callbacks = CallbackConfig.load(data_dir)
    hub = Hub(
        store,
        lease_seconds=lease_seconds,
        max_attempts=max_attempts,
        max_text=max_text,
        callbacks=callbacks,
        retention_seconds=retention_seconds,
    )
    # the adapters this server runs check settings: a webhook's service in its registry,
    # a tmux pane on this host's tmux (where its dispatcher types)
    register_checks(hub.delivery_checks, hub.callbacks, panes=True)
    app = create_app(hub, token)
    _add_metrics(app, hub, token)

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            way_out = "give --host an address of this machine (0.0.0.0 listens on all)"
        else:
            way_out = "pick another --port (0 chooses a free one)"
        say(f"[red]error:[/red] cannot listen on {host}:{port}: {exc.strerror}; {way_out}")
        raise SystemExit(1) from None
    sock.listen(2048)
    sock.setblocking(False)
    bound = sock.getsockname()[1]
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{bound}"

    asked = limits or ConnectionLimits()
    limits = asked.within_open_files()
    if limits.max_connections < asked.max_connections:
        say(
            f"connections capped at {limits.max_connections} (half the open-file limit; "
            "raise it with ulimit -n)"
        )
    uv_config = uvicorn.Config(
        _EndedByShutdown(app, lambda: server.should_exit),
        loop=_event_loop_kind(),
        http=guarded_protocol(limits),
        log_level="warning",
        access_log=False,
        server_header=False,  # no "server: uvicorn" on every answer
        log_config=None,  # uvicorn's records go through the handler logs.configure set
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    server = uvicorn.Server(uv_config)

    async def main() -> None:
        # open the store first, so a bad store URL fails before we claim to listen
        await hub.start()
        if (warning := callbacks.unscoped_warning(await hub.count_teams())) is not None:
            say(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
        # push delivery: inbox files, tmux, stdin, webhooks; every hub of a store may run
        # it (each member is pushed by the hub holding its lease in the store)
        dispatcher = Dispatcher(hub, ownership_s=dispatch_lease) if dispatch else None
        if dispatcher is not None:
            await dispatcher.start()
        # Claude Code inbox files read back: teammates' replies, protocol frames
        bridge = InboxBridge(hub) if dispatch else None
        if bridge is not None:
            await bridge.start()
        config.write_server_info(data_dir, url, store.url)
        say(
            f"backchannel listening on [bold]{url}[/bold]  store: {config.redact_url(store.url)}  "
            f"data: {data_dir}"
        )
        say(f"dashboard: {url}/   admin token: {data_dir / config.ADMIN_TOKEN_FILE}")

        def _hangup() -> None:
            stopped_by.append("SIGHUP")
            server.should_exit = True

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _hangup)
        try:
            await server.serve(sockets=[sock])
        finally:
            config.clear_server_info(data_dir)
            if bridge is not None:
                await bridge.stop()
            if dispatcher is not None:
                await dispatcher.stop()
            await hub.close()

    stopped_by: list[str] = []

    def _terminate(signum: int, frame: object) -> None:
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it; raising SystemExit
        # here (instead of dying on the default handler) lets main() close the hub
        stopped_by.append("SIGTERM")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminate)

    try:
        if uv_config.loop == "uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())
    except KeyboardInterrupt:
        stopped_by.append("SIGINT")
    except SystemExit:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            _crashed(exc, data_dir)
        # a full disk (server.json not written): what to do, not where it happened
        where = f"{exc.filename}: " if exc.filename else ""
        log.critical("backchannel serve stopped: %s%s", where, exc.strerror or exc)
        _clear_server_info(data_dir)
        raise SystemExit(1) from None
    except BaseException as exc:
        _crashed(exc, data_dir)
    reason = stopped_by[0] if stopped_by else "the server's own shutdown"
    say(f"backchannel stopped on {reason}")


def _crashed(exc: BaseException, data_dir: Path) -> NoReturn:
    log.critical("backchannel serve crashed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    _clear_server_info(data_dir)
    raise SystemExit(1) from None


def _clear_server_info(data_dir: Path) -> None:
    try:
        config.clear_server_info(data_dir)
    except OSError as cleanup:  # the data directory may be what failed
        log.critical("could not remove %s: %s", config.SERVER_FILE, cleanup)
