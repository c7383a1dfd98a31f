"""The Hub: everything that talks to a hub (the SDK, the HTTP API, the CLI, the MCP
server, the runner) goes through its methods.

The caller is always already authenticated: the ``sender`` or ``member`` passed in is
the member the token belongs to. Each part lives in its own module:

* :mod:`backchannel._base` — teams, members, messages, leases, scheduled jobs;
* :mod:`backchannel._sessions` — sessions, turns, events, the ledger, checkpoints;
* :mod:`backchannel._links` — links between sessions;
* :mod:`backchannel._timers` — timers with intent and the anchor rule.
"""

from __future__ import annotations

from backchannel._base import (
    AckResult,
    FeedItem,
    HubBase,
    HubMiddleware,
    MessageStatus,
    hash_token,
    new_token,
)
from backchannel._sessions import StopResult, session_json
from backchannel._timers import Timer, TimersMixin

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


class Hub(TimersMixin, HubBase):
    """A message hub on a store. Use as ``async with Hub(store) as hub:``."""
