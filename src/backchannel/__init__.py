"""backchannel: a durable message hub for teams of AI agents.

Import what you need from here; the submodules may move.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backchannel.client import Client, Received, SyncClient, connect, connect_sync
    from backchannel.errors import (
        AlreadyExists,
        BackchannelError,
        BudgetExhausted,
        Conflict,
        Forbidden,
        InvalidName,
        InvalidRequest,
        InvalidState,
        MessageIdConflict,
        NotFound,
        PeerError,
        QuotaExceeded,
        RequestError,
        ServiceError,
        StoreError,
        TooLarge,
        Unauthorized,
        UnknownMember,
        UnknownMessage,
        UnknownRecipient,
        UnknownSession,
        UnknownTeam,
    )
    from backchannel.hub import AckResult, Hub, HubMiddleware, MessageStatus
    from backchannel.stores.base import Store, Tx
    from backchannel.stores.memory import MemoryStore
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.types import (
        BROADCAST,
        USER,
        Delivery,
        DeliveryEvent,
        DeliveryState,
        InboxMessage,
        Member,
        MemberKind,
        Message,
        MessageKind,
        Recipient,
        SendResult,
        Session,
        SessionState,
        Team,
    )

__version__ = "0.1.0"

__all__ = [
    "BROADCAST",
    "USER",
    "AckResult",
    "AlreadyExists",
    "BackchannelError",
    "BudgetExhausted",
    "Client",
    "Conflict",
    "Delivery",
    "DeliveryEvent",
    "DeliveryState",
    "Forbidden",
    "Hub",
    "HubMiddleware",
    "InboxMessage",
    "InvalidName",
    "InvalidRequest",
    "InvalidState",
    "Member",
    "MemberKind",
    "MemoryStore",
    "Message",
    "MessageIdConflict",
    "MessageKind",
    "MessageStatus",
    "NotFound",
    "PeerError",
    "QuotaExceeded",
    "Received",
    "Recipient",
    "RequestError",
    "SendResult",
    "ServiceError",
    "Session",
    "SessionState",
    "SqliteStore",
    "Store",
    "StoreError",
    "SyncClient",
    "Team",
    "TooLarge",
    "Tx",
    "Unauthorized",
    "UnknownMember",
    "UnknownMessage",
    "UnknownRecipient",
    "UnknownSession",
    "UnknownTeam",
    "__version__",
    "connect",
    "connect_sync",
]

# Names load on first use, so that a command hook that imports one small module does
# not pay for the hub, the stores and the HTTP client.
_WHERE: dict[str, str] = {
    "Client": "backchannel.client",
    "Received": "backchannel.client",
    "SyncClient": "backchannel.client",
    "connect": "backchannel.client",
    "connect_sync": "backchannel.client",
    "AlreadyExists": "backchannel.errors",
    "BackchannelError": "backchannel.errors",
    "BudgetExhausted": "backchannel.errors",
    "Conflict": "backchannel.errors",
    "Forbidden": "backchannel.errors",
    "InvalidName": "backchannel.errors",
    "InvalidRequest": "backchannel.errors",
    "InvalidState": "backchannel.errors",
    "MessageIdConflict": "backchannel.errors",
    "NotFound": "backchannel.errors",
    "PeerError": "backchannel.errors",
    "QuotaExceeded": "backchannel.errors",
    "RequestError": "backchannel.errors",
    "ServiceError": "backchannel.errors",
    "StoreError": "backchannel.errors",
    "TooLarge": "backchannel.errors",
    "Unauthorized": "backchannel.errors",
    "UnknownMember": "backchannel.errors",
    "UnknownMessage": "backchannel.errors",
    "UnknownRecipient": "backchannel.errors",
    "UnknownSession": "backchannel.errors",
    "UnknownTeam": "backchannel.errors",
    "AckResult": "backchannel.hub",
    "Hub": "backchannel.hub",
    "HubMiddleware": "backchannel.hub",
    "MessageStatus": "backchannel.hub",
    "Store": "backchannel.stores.base",
    "Tx": "backchannel.stores.base",
    "MemoryStore": "backchannel.stores.memory",
    "SqliteStore": "backchannel.stores.sqlite",
    "BROADCAST": "backchannel.types",
    "USER": "backchannel.types",
    "Delivery": "backchannel.types",
    "DeliveryEvent": "backchannel.types",
    "DeliveryState": "backchannel.types",
    "InboxMessage": "backchannel.types",
    "Member": "backchannel.types",
    "MemberKind": "backchannel.types",
    "Message": "backchannel.types",
    "MessageKind": "backchannel.types",
    "Recipient": "backchannel.types",
    "SendResult": "backchannel.types",
    "Session": "backchannel.types",
    "SessionState": "backchannel.types",
    "Team": "backchannel.types",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'backchannel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
