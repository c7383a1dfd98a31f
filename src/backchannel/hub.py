"""The Hub: everything that talks to a hub (the SDK, the HTTP API, the CLI, the MCP
server, the runner) goes through its methods.

The caller is always already authenticated: the ``sender`` or ``member`` passed in is
the member the token belongs to. Each part lives in its own module:

* :mod:`backchannel._base` — teams, members, messages, leases, scheduled jobs;
* :mod:`backchannel._sessions` — sessions, turns, events, the ledger, checkpoints;
* :mod:`backchannel._links` — links between sessions;
* :mod:`backchannel._timers` — timers with intent and the anchor rule;
* :mod:`backchannel._outbox` — durable, retried POSTs to registered services;
* :mod:`backchannel._delegation` — agents called as asynchronous tools;
* :mod:`backchannel._inbox` — Claude Code inbox files read back, once.
* :mod:`backchannel._budget` — conversation budgets per pair and per chain.
* :mod:`backchannel._admin` — token rotation, member and team removal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel._admin import AdminMixin, Removal
from backchannel._base import (
    AckResult,
    FeedItem,
    HubBase,
    HubMiddleware,
    MessageStatus,
    hash_token,
    new_token,
)
from backchannel._budget import BudgetMixin
from backchannel._inbox import InboxMixin, TakeResult
from backchannel._sessions import StopResult, session_json
from backchannel._timers import Timer
from backchannel.callbacks import CallbackConfig
from backchannel.core import delivery
from backchannel.stores.base import Store, Tx
from backchannel.types import HUB_SENDER, Message, MessageKind

__all__ = [
    "AckResult",
    "FeedItem",
    "Hub",
    "HubMiddleware",
    "MessageStatus",
    "Removal",
    "StopResult",
    "TakeResult",
    "Timer",
    "hash_token",
    "new_token",
    "session_json",
]


class Hub(InboxMixin, AdminMixin, BudgetMixin, HubBase):
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

    async def notice(
        self,
        team: str,
        to: str,
        text: str,
        *,
        message_id: str,
        summary: str,
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Send the hub's own ``system`` notice to member ``to`` (for parts outside the
        hub, such as the delivery dispatcher, that must tell a member something).
        Idempotent on ``message_id``; False when it was sent already or ``to`` is no
        member of ``team``."""
        now = self.clock.now()
        msg = Message(
            team=team,
            message_id=message_id,
            sender=HUB_SENDER,
            to=to,
            text=text,
            kind=MessageKind.SYSTEM,
            created_at=now,
            fingerprint=delivery.fingerprint(HUB_SENDER, to, text, summary, "system"),
            summary=summary,
            meta=dict(meta or {}),
        )

        def fn(tx: Tx) -> bool:
            if tx.get_member(team, to) is None or tx.get_message(team, message_id) is not None:
                return False
            self._insert(tx, msg, None)
            return True

        sent = await self.store.transact(fn)
        if sent:
            self._waiters.notify(team, to)
        return sent
