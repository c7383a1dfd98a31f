"""``backchannel serve``: the hub, its HTTP API and streams, on uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from pathlib import Path

import uvicorn
from rich.console import Console

from backchannel import config
from backchannel.callbacks import CallbackConfig
from backchannel.delivery.dispatcher import Dispatcher
from backchannel.hub import Hub
from backchannel.interfaces.http import create_app


def _event_loop_kind() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def _http_kind() -> str:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


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
) -> None:
    """Serve until SIGINT/SIGTERM. Raises ``StoreError`` if the store cannot be opened."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    token = config.admin_token(data_dir)
    assert token is not None
    store = config.open_store(store_url)
    callbacks = CallbackConfig.load(data_dir)
    hub = Hub(
        store,
        lease_seconds=lease_seconds,
        max_attempts=max_attempts,
        max_text=max_text,
        callbacks=callbacks,
    )
    app = create_app(hub, token)

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        console.print(
            f"[red]error:[/red] cannot listen on {host}:{port}: {exc.strerror}; "
            "pick another --port (0 chooses a free one)"
        )
        raise SystemExit(1) from None
    sock.listen(2048)
    sock.setblocking(False)
    bound = sock.getsockname()[1]
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{bound}"

    uv_config = uvicorn.Config(
        app,
        loop=_event_loop_kind(),
        http=_http_kind(),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    server = uvicorn.Server(uv_config)

    async def main() -> None:
        # open the store first, so a bad store URL fails before we claim to listen
        await hub.start()
        # push delivery: inbox files, tmux, stdin, webhooks (one dispatcher per store)
        dispatcher = Dispatcher(hub) if dispatch else None
        if dispatcher is not None:
            await dispatcher.start()
        config.write_server_info(data_dir, url, store.url)
        console.print(
            f"backchannel listening on [bold]{url}[/bold]  store: {config.redact_url(store.url)}  "
            f"data: {data_dir}"
        )
        console.print(f"dashboard: {url}/   admin token: {data_dir / config.ADMIN_TOKEN_FILE}")
        try:
            await server.serve(sockets=[sock])
        finally:
            config.clear_server_info(data_dir)
            if dispatcher is not None:
                await dispatcher.stop()
            await hub.close()

    def _terminate(signum: int, frame: object) -> None:
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it; raising SystemExit
        # here (instead of dying on the default handler) lets main() close the hub
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminate)

    if uv_config.loop == "uvloop":
        import uvloop

        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(main())
    else:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
