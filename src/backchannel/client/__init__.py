"""The Python SDK: one client over a running hub (HTTP) or a hub in this process.

::

    async with backchannel.Client("http://127.0.0.1:8765", token=TOKEN) as hub:
        await hub.send("worker-1", "count the lines in src/")
        async for msg in hub.inbox():
            print(msg.sender, msg.text)
            await msg.ack()

The URL says where the hub is: ``http(s)://`` talks to a running hub;
``sqlite:///path``, ``postgresql://...`` or ``memory://`` runs one inside this process on
that store; :meth:`Client.local` uses a hub this process already runs. Either way the
calls and their typed answers (:mod:`backchannel.models`) are the same. Without a token
an in-process client acts as the administrator. :class:`SyncClient` gives the same
calls without ``await``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backchannel.client._async import Client
from backchannel.client._sync import SyncClient
from backchannel.client._transport import HttpTransport, LocalTransport, Transport
from backchannel.models import Received

if TYPE_CHECKING:
    from backchannel.hub import Hub

__all__ = [
    "Client",
    "HttpTransport",
    "LocalTransport",
    "Received",
    "SyncClient",
    "Transport",
    "attach",
    "connect",
    "connect_sync",
]


def connect(url: str, token: str | None = None, **hub_options: Any) -> Client:
    """``Client(url, token)``: a client for a hub at ``url`` (``http(s)://``) or a store
    opened in this process (``sqlite:///path``, ``postgresql://...``, ``memory://``)."""
    return Client(url, token, **hub_options)


def attach(hub: Hub, token: str | None = None) -> Client:
    """``Client.local(hub, token)``: a client of a hub this process already runs."""
    return Client.local(hub, token)


def connect_sync(url: str, token: str | None = None, **hub_options: Any) -> SyncClient:
    """``SyncClient(url, token)``: ``with connect_sync(url, token) as hub: hub.send(...)``."""
    return SyncClient(url, token, **hub_options)
