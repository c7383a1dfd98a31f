"""One exception tree for the whole package.

Every error carries a stable ``code`` (the HTTP API's ``error.code``), the HTTP
``status`` it maps to, and ``details`` for machines. Messages name the bad input and
the way out. "You did something wrong", "a peer or the store failed, retrying may
work" and "delivery cannot succeed" are kept apart::

    BackchannelError
    ├── RequestError                 the caller must change the request (4xx)
    │   ├── InvalidRequest           422 invalid_request: a field is missing, mistyped or malformed
    │   │   ├── InvalidName          422 invalid_name: team, member or session name
    │   │   ├── HookInputError       422 invalid_hook_input: a runtime's hook payload cannot be used
    │   │   └── AttachError          422 attach_failed: a project file cannot be merged
    │   ├── UnknownService           400 unknown_callback_service: not in the callback registry
    │   ├── TooLarge                 413 too_large
    │   ├── Unauthorized             401 unauthorized: missing or wrong token
    │   ├── Forbidden                403 forbidden: authenticated, but not allowed
    │   │   ├── AnchorRequired       403 anchor_required: set an anchor timer before messaging a linked peer
    │   │   ├── TranscriptRefused    403 transcript_refused: not a transcript this hook may read
    │   │   └── ServiceNotAllowed    403 callback_service_not_allowed: other teams' or another member's
    │   ├── NotFound                 404 not_found
    │   │   ├── UnknownTeam          404 unknown_team
    │   │   ├── UnknownMember        404 unknown_member
    │   │   │   └── UnknownRecipient 404 unknown_recipient (with ``suggestions``)
    │   │   ├── UnknownSession       404 unknown_session
    │   │   └── UnknownMessage       404 unknown_message
    │   ├── Conflict                 409 conflict
    │   │   ├── AlreadyExists        409 already_exists
    │   │   ├── MessageIdConflict    409 message_id_conflict
    │   │   └── InvalidState         409 invalid_state: e.g. an event for a terminated session
    │   ├── BudgetExhausted          429 budget_exhausted: a pair's or chain's conversation budget is spent
    │   ├── QuotaExceeded            429 quota_exceeded: too many pending timers or queued messages
    │   └── ToolFailed               422 tool_failed: a built-in agent's tool call; the model sees why
    └── ServiceError                 a peer or the store failed (5xx)
        ├── StoreError               503 store_unavailable; retrying may work
        │   └── RetryTransaction     (stores.postgres)    re-run by the store itself, never raised past it
        ├── PeerError                502 peer_failed: a remote hub or callback failed; retrying may work
        │   ├── AdapterError         502 delivery_failed: not delivered this time; retried with backoff
        │   │   └── HeldDelivery     502 delivery_held: the medium must not take a message now
        │   ├── InboxWriteError      502 inbox_write_failed: a Claude Code inbox entry was not written
        │   ├── StdinClosed          502 stdin_closed: an agent process no longer takes input
        │   └── ModelError           502 model_failed: the model service failed after its retries
        └── PermanentDeliveryError   502 delivery_impossible: retrying will not help; the copy is dead

Delivery and runtime modules re-export the classes they raise (``backchannel.delivery.base``
still offers ``AdapterError``). A few private exceptions carry control flow inside one
module (``_Abort``, ``_LockLost``, ``_BodyTooLarge``, ``_Final``) and never leave it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AdapterError",
    "AlreadyExists",
    "AnchorRequired",
    "AttachError",
    "BackchannelError",
    "BudgetExhausted",
    "ClockSkew",
    "Conflict",
    "Forbidden",
    "HeldDelivery",
    "HookInputError",
    "InboxWriteError",
    "InvalidName",
    "InvalidRequest",
    "InvalidState",
    "MessageIdConflict",
    "ModelError",
    "NotFound",
    "PeerError",
    "PermanentDeliveryError",
    "QuotaExceeded",
    "RequestError",
    "ServiceError",
    "StdinClosed",
    "StoreError",
    "TooLarge",
    "ToolFailed",
    "TranscriptRefused",
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


def token_revoked(while_: str, way_out: str | None = None) -> Unauthorized:
    """The refusal of a token that stopped acting for its member (rotated, or the member
    removed) ``while_`` its request waited or its stream ran: one text wherever a
    request that outlives a rotation asks again (long-polls, streams, A2A, the
    dashboard)."""
    return Unauthorized(
        f"this token was rotated or its member removed while {while_}; "
        + (way_out or "use the member's new token (`backchannel member rotate-token` shows one)")
    )


class Forbidden(RequestError):
    code = "forbidden"
    status = 403


class ServiceNotAllowed(Forbidden):
    """A callback service registered for other teams than the caller's, or bound (its
    ``member:``) to another member than the caller."""

    code = "callback_service_not_allowed"


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


class EventsSkipped(Conflict):
    """A feed stream resumed after a cursor some of whose later events retention removed
    (``after``, ``through``: the cursors between which events are gone)."""

    code = "events_skipped"


class QuotaExceeded(RequestError):
    code = "quota_exceeded"
    status = 429


class ServiceError(BackchannelError):
    code = "service_error"
    status = 503


class StoreError(ServiceError):
    code = "store_unavailable"
    status = 503


class ClockSkew(ServiceError):
    """This hub's clock and the shared database's differ by more than the hubs on one
    database tolerate (a hub ahead would take other hubs' live leases back early)."""

    code = "clock_skew"
    status = 503


class PeerError(ServiceError):
    code = "peer_failed"
    status = 502


class HookInputError(InvalidRequest, ValueError):
    """A runtime's hook payload cannot be used (malformed, or a field is missing or
    mistyped)."""

    code = "invalid_hook_input"


class AttachError(InvalidRequest):
    """A project file cannot be merged (it is not valid JSON or TOML, or has another shape)."""

    code = "attach_failed"


class TranscriptRefused(Forbidden, ValueError):
    """The named transcript is not one this runtime's hook may read (the message says why)."""

    code = "transcript_refused"


class ToolFailed(RequestError):
    """A built-in agent's tool call the model can learn from: its message goes back as
    the tool error."""

    code = "tool_failed"
    status = 422


class AdapterError(PeerError):
    """A transient failure: the message was not delivered, and trying again may work.

    ``retry_after`` (seconds), when the peer said how long to wait (a ``Retry-After``
    header), replaces the policy's delay for the next attempt, capped at the policy's cap.
    ``tell_operator``: should the copy be given up after this error, the team's human is
    told as well as the sender (part of the message was left where only a person can
    finish or undo it, e.g. a text typed into a prompt but not submitted).
    ``unreachable``: the target itself could not be reached (a connection refused, an
    attempt that timed out), not a refusal of this message: a copy given up after such
    an error marks the member's push down (:mod:`backchannel.delivery.circuit`).
    """

    code = "delivery_failed"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        tell_operator: bool = False,
        unreachable: bool = False,
        **details: Any,
    ) -> None:
        super().__init__(message, **details)
        self.retry_after = retry_after
        self.tell_operator = tell_operator
        self.unreachable = unreachable


class HeldDelivery(AdapterError):
    """The medium is there but must not take a message now (a terminal pane whose
    foreground program is not the agent: a shell would run the text as commands). The
    copy goes back to the queue untouched by backoff or retry budget, and nothing is
    leased until the adapter says the medium is ready again; held longer than the
    delivery's ``hold_max``, it is given up. ``shows``: the line of the screen that
    holds it (a dialog's, a panel's), for the reason it is given up with."""

    code = "delivery_held"

    def __init__(self, message: str, *, shows: str | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        self.shows = shows


class InboxWriteError(PeerError):
    """A Claude Code inbox entry could not be written (lock not won in time, I/O error,
    failed check). The caller must not acknowledge the message. The inbox is unchanged
    unless the message says the entry was written but not found on reading back."""

    code = "inbox_write_failed"


class StdinClosed(PeerError):
    """The agent's stdin no longer takes input (the process exited or closed it)."""

    code = "stdin_closed"


class ModelError(PeerError):
    """The model service failed (after the provider's retries)."""

    code = "model_failed"


class PermanentDeliveryError(ServiceError):
    """Delivery cannot succeed (a pane that is gone, a 404, a setting that names nothing):
    the copy is dead-lettered with this message as the reason, which should name the fix.
    Not a :class:`PeerError`: retrying will not help."""

    code = "delivery_impossible"
    status = 502
