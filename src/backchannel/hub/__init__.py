"""The hub: everything that talks to a hub (the SDK, the HTTP API, the CLI, the MCP
server, the runner) goes through :class:`Hub`'s methods; see docs/architecture.md."""

from backchannel.hub.facade import (
    AckResult,
    FeedItem,
    Hub,
    HubMiddleware,
    Leased,
    MessageStatus,
    Outgoing,
    Removal,
    StopResult,
    TakeResult,
    Timer,
    hash_token,
    new_token,
    session_json,
)

__all__ = [
    "AckResult",
    "FeedItem",
    "Hub",
    "HubMiddleware",
    "Leased",
    "MessageStatus",
    "Outgoing",
    "Removal",
    "StopResult",
    "TakeResult",
    "Timer",
    "hash_token",
    "new_token",
    "session_json",
]
