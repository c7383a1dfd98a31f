"""The Hub facade: everything that talks to a hub goes through its methods.

The caller is always already authenticated: the ``sender`` or ``member`` passed in is
the member the token belongs to. docs/architecture.md draws the parts and their order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel.callbacks import CallbackConfig
from backchannel.core import messages
from backchannel.hub.admin import AdminMixin, Removal
from backchannel.hub.budgets import BudgetMixin
from backchannel.hub.inbox import InboxMixin, TakeResult
from backchannel.hub.messages import (
    AckResult,
    FeedItem,
    HubBase,
    HubMiddleware,
    MessageStatus,
    hash_token,
    new_token,
)
from backchannel.hub.sessions import StopResult, session_json
from backchannel.hub.timers import Timer
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
            fingerprint=messages.fingerprint(HUB_SENDER, to, text, summary, "system"),
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
