"""Which hub or store a CLI command talks to, said plainly, and never invented.

In order: ``--url``/``--store`` or ``BACKCHANNEL_URL``; else the server that ``serve``
recorded in the data directory (``$BACKCHANNEL_HOME/server.json``, default
``./.backchannel``); else the SQLite store already in the data directory, opened in
this process. Nothing else: a command never creates a store as a side effect, only
``serve``, ``init`` or an explicit ``--store`` do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backchannel import config
from backchannel.client import Received
from backchannel.client._async import LOCAL_SCHEMES
from backchannel.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class Target:
    """Where a command goes: an ``http(s)://`` hub or a store URL, and how it was found."""

    url: str
    found_by: str
    data_dir: Path

    @property
    def is_http(self) -> bool:
        return self.url.startswith(("http://", "https://"))

    def describe(self) -> str:
        kind = "hub" if self.is_http else "store (no server; opened in this process)"
        return f"{kind} {config.redact_url(self.url)}, found by {self.found_by}"

    def to_json(self) -> dict[str, Any]:
        return {
            "url": config.redact_url(self.url),
            "kind": "hub" if self.is_http else "store",
            "found_by": self.found_by,
            "data_dir": str(self.data_dir),
        }


def no_hub_message(data_dir: Path) -> str:
    return (
        f"no hub found: no running server recorded in {data_dir / config.SERVER_FILE} and no "
        f"store in {data_dir}. Start one with `backchannel serve` (in another terminal, from the "
        "same directory), point at one with BACKCHANNEL_URL=http://HOST:PORT (or --url), set "
        "BACKCHANNEL_HOME to the data directory `serve` uses, or create a store here without a "
        "server with `backchannel init`"
    )


def locate(url: str | None, home: Path | None) -> Target:
    """The hub or store a command uses. Raises ``InvalidRequest`` (with the ways out) when
    there is none, rather than creating one."""
    data_dir = config.home(home)
    if url:
        by = "BACKCHANNEL_URL" if os.environ.get("BACKCHANNEL_URL") == url else "--url/--store"
        if (http := config.hub_http_url(url)) is not None:
            return Target(http, by, data_dir)
        if not url.startswith(LOCAL_SCHEMES):
            raise InvalidRequest(
                f"cannot tell where {config.redact_url(url)!r} ({by}) is: use "
                "http(s)://HOST:PORT for a running hub, or sqlite:///PATH, postgresql://... "
                "or memory:// for a store opened in this process"
            )
        return Target(url, by, data_dir)
    info = config.read_server_info(data_dir)
    if info is not None:
        return Target(str(info["url"]), f"{data_dir / config.SERVER_FILE}", data_dir)
    if (data_dir / config.DB_FILE).exists():
        return Target(config.default_store_url(data_dir), f"the store in {data_dir}", data_dir)
    raise InvalidRequest(no_hub_message(data_dir))


def init_store(store: str | None, home: Path | None) -> tuple[Path, str, bool]:
    """``backchannel init``: the data directory (0700), its admin token and its store.
    Returns the directory, the store URL and whether the store is new."""
    import asyncio

    from backchannel.hub import Hub

    data_dir = config.home(home)
    config.admin_token(data_dir)  # the data directory first (0700)
    url = store or config.default_store_url(data_dir)
    existed = (data_dir / config.DB_FILE).exists() if store is None else False

    async def open_and_close() -> None:
        hub = Hub(config.open_store(url))
        await hub.start()
        await hub.close()

    asyncio.run(open_and_close())
    return data_dir, url, not existed


def message_json(m: Received) -> dict[str, Any]:
    """A received message with the HTTP API's field names (``from``, not ``sender``)."""
    return {
        "message_id": m.message_id,
        "from": m.sender,
        "to": m.to,
        "kind": m.kind,
        "text": m.text,
        "summary": m.summary,
        "created_at": m.created_at,
        "attempt": m.attempt,
        "session": m.session,
        "meta": m.meta,
    }
