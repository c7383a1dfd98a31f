"""The Hub: everything that talks to a hub (the SDK, the HTTP API, the CLI, the MCP
server, the runner) goes through its methods.

The caller is always already authenticated: the ``sender`` or ``member`` passed in is
the member the token belongs to. Each part lives in its own module:

* :mod:`backchannel._base` — teams, members, messages, leases, scheduled jobs;
* :mod:`backchannel._sessions` — sessions, turns, events, the ledger, checkpoints;
* :mod:`backchannel._links` — links between sessions;
* :mod:`backchannel._timers` — timers with intent and the anchor rule;
* :mod:`backchannel._outbox` — durable, retried POSTs to registered services;
* :mod:`backchannel._delegation` — agents called as asynchronous tools.
"""

from __future__ import annotations

from typing import Any

from backchannel._base import (
    AckResult,
    FeedItem,
    HubBase,
    HubMiddleware,
    MessageStatus,
    hash_token,
    new_token,
)
from backchannel._delegation import DelegationMixin
from backchannel._sessions import StopResult, session_json
from backchannel._timers import Timer
from backchannel.callbacks import CallbackConfig
from backchannel.stores.base import Store

__all__ = [
    "AckResult",
    "FeedItem",
    "Hub",
    "HubMiddleware",
    "MessageStatus",
    "StopResult",
    "Timer",
    "hash_token",
    "new_token",
    "session_json",
]


class Hub(DelegationMixin, HubBase):
    """A message hub on a store. Use as ``async with Hub(store) as hub:``.

    ``callbacks`` is the callback registry (where delegation answers and webhooks may
    go); by default it is read from the environment.
    """

    def __init__(
        self, store: Store, *, callbacks: CallbackConfig | None = None, **options: Any
    ) -> None:
        super().__init__(store, **options)
        self._init_outbox(callbacks)

    async def close(self) -> None:
        await self._close_outbox()
        await super().close()
