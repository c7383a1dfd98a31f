"""One exception tree for the whole package.

Every error carries a stable ``code`` (the HTTP API's ``error.code``), the HTTP
``status`` it maps to, and ``details`` for machines. Messages name the bad input and
the way out. "You did something wrong" and "a peer or the store failed" are kept
apart, as the HTTP status classes are::

    BackchannelError
    ├── RequestError                 the caller must change the request (4xx)
    │   ├── InvalidRequest           422 invalid_request: a field is missing, mistyped or malformed
    │   │   └── InvalidName          422 invalid_name: team, member or session name
    │   ├── UnknownService           400 unknown_callback_service: not in the callback registry
    │   ├── TooLarge                 413 too_large
    │   ├── Unauthorized             401 unauthorized: missing or wrong token
    │   ├── Forbidden                403 forbidden: authenticated, but not allowed
    │   │   └── AnchorRequired       403 anchor_required: set an anchor timer before messaging a linked peer
    │   ├── NotFound                 404 not_found
    │   │   ├── UnknownTeam          404 unknown_team
    │   │   ├── UnknownMember        404 unknown_member
    │   │   │   └── UnknownRecipient 404 unknown_recipient (with ``suggestions``)
    │   │   ├── UnknownSession       404 unknown_session
    │   │   └── UnknownMessage       404 unknown_message
    │   ├── BudgetExhausted          429 budget_exhausted: a pair's or chain's conversation budget is spent
    │   └── Conflict                 409 conflict
    │       ├── AlreadyExists        409 already_exists
    │       ├── MessageIdConflict    409 message_id_conflict
    │       └── InvalidState         409 invalid_state: e.g. an event for a terminated session
    │   └── QuotaExceeded            429 quota_exceeded: too many pending timers or queued messages
    └── ServiceError                 a peer or the store failed; retrying may work (5xx)
        ├── StoreError               503 store_unavailable
        └── PeerError                502 peer_failed: a remote hub or callback failed
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyExists",
    "AnchorRequired",
    "BackchannelError",
    "BudgetExhausted",
    "Conflict",
    "Forbidden",
    "InvalidName",
    "InvalidRequest",
    "InvalidState",
    "MessageIdConflict",
    "NotFound",
    "PeerError",
    "QuotaExceeded",
    "RequestError",
    "ServiceError",
    "StoreError",
    "TooLarge",
    "Unauthorized",
    "UnknownMember",
    "UnknownMessage",
    "UnknownRecipient",
    "UnknownService",
    "UnknownSession",
    "UnknownTeam",
]


class BackchannelError(Exception):
    code = "error"
    status = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class RequestError(BackchannelError):
    code = "bad_request"
    status = 400


class InvalidRequest(RequestError):
    code = "invalid_request"
    status = 422


class InvalidName(InvalidRequest):
    code = "invalid_name"


class UnknownService(RequestError):
    code = "unknown_callback_service"
    status = 400


class TooLarge(RequestError):
    code = "too_large"
    status = 413


class Unauthorized(RequestError):
    code = "unauthorized"
    status = 401


class Forbidden(RequestError):
    code = "forbidden"
    status = 403


class AnchorRequired(Forbidden):
    code = "anchor_required"


class BudgetExhausted(RequestError):
    """A send between two members (or in a chain) over its conversation budget. The
    details say which budget, when it resets and who can extend it."""

    code = "budget_exhausted"
    status = 429


class NotFound(RequestError):
    code = "not_found"
    status = 404


class UnknownTeam(NotFound):
    code = "unknown_team"


class UnknownMember(NotFound):
    code = "unknown_member"


class UnknownRecipient(UnknownMember):
    code = "unknown_recipient"


class UnknownSession(NotFound):
    code = "unknown_session"


class UnknownMessage(NotFound):
    code = "unknown_message"


class Conflict(RequestError):
    code = "conflict"
    status = 409


class AlreadyExists(Conflict):
    code = "already_exists"


class MessageIdConflict(Conflict):
    code = "message_id_conflict"


class InvalidState(Conflict):
    code = "invalid_state"


class QuotaExceeded(RequestError):
    code = "quota_exceeded"
    status = 429


class ServiceError(BackchannelError):
    code = "service_error"
    status = 503


class StoreError(ServiceError):
    code = "store_unavailable"
    status = 503


class PeerError(ServiceError):
    code = "peer_failed"
    status = 502
