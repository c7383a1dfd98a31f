"""Delegation rules: reply tokens, retry policy, and how results read to the caller.

Reply tokens are ``base64url(payload_json) + "." + base64url(HMAC_SHA256(secret,
payload_json))`` over ``session_id``, ``tool_use_id``, ``tool_id``, ``name``,
``total_tools``, ``iat``, ``exp`` and a one-time ``jti``. They are verified in constant
time; spending the ``jti`` (so a token works once) is the store's part.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backchannel.core.budget import NOT_SENT
from backchannel.core.messages import MAX_SESSION_ID, derived_id
from backchannel.errors import InvalidRequest, Unauthorized
from backchannel.types import Delegation, DelegationState

DEFAULT_TIMEOUT = 300.0
DEADLINE_JOB = "delegation_deadline"
PRUNE_JOB = "delegation_prune"
PRUNE_INTERVAL = 3600.0  # finished delegations are looked for at most this often
TOKEN_GRACE = 3600.0  # a reply token outlives its delegation's deadline by this much
#: States in which a delegation still waits for its callee's answer.
OPEN_STATES = frozenset({DelegationState.PENDING, DelegationState.TIMED_OUT})
#: States in which a delegation holds its callee's answer.
ANSWERED_STATES = frozenset({DelegationState.ANSWERED, DelegationState.LATE})
#: How an answer with no text reads to the caller (never a bare, empty tool result).
EMPTY_ANSWER = "(the agent answered with no text)"
MAX_BEARER_TOKEN = 4096  # longest reply.bearerToken accepted from another hub


def results_message_id(batch: str) -> str:
    """The id of the message that gathers a caller turn's results: a valid message id
    (``#`` is not allowed in one), hashed when the session id makes it too long."""
    mid = "results-" + batch.replace("#", ".")
    if len(mid) <= 128:
        return mid
    return "results-" + hashlib.sha256(batch.encode("utf-8")).hexdigest()[:40]


def sub_session(caller_session: str, tool_use_id: str) -> str:
    """The callee's session for one request: ``<caller session>--<tool_use_id>``, its
    start and a hash when that is longer than a session id may be, so the callee can
    always name it."""
    return derived_id(f"{caller_session}--{tool_use_id}", MAX_SESSION_ID)


def inbound_session(caller: str, session_id: str) -> str:
    """How the callee hub names the session of another hub's request: ``{caller}:
    {session_id}``. Session ids are chosen by each caller, so two callers may send the
    same one; with the caller's member name in front (which holds no ``:``), one caller's
    request can never be taken for another's."""
    return f"{caller}:{session_id}"


def request_key(reply_token: str) -> str:
    """What names another hub's task that carries no ``session_id`` or ``tool_use_id``
    (hex): a hash of its reply token, which its hub signs for this one call, so the
    same task sent again is the same request and a new one, with a token of its own,
    is another."""
    return hashlib.sha256(reply_token.encode("utf-8")).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_token(secret: str, claims: Mapping[str, Any], *, now: float, ttl: float) -> str:
    """Sign ``claims`` (session_id, tool_use_id, tool_id, name, total_tools) with
    ``iat``, ``exp`` and a fresh ``jti``."""
    payload = {
        **claims,
        "iat": int(now),
        "exp": int(now + ttl),
        "jti": secrets.token_urlsafe(16),
    }
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")
    sig = hmac.new(secret.encode("utf-8"), raw, hashlib.sha256).digest()
    return f"{_b64(raw)}.{_b64(sig)}"


_REQUIRED = ("session_id", "tool_use_id", "tool_id", "name", "total_tools", "iat", "exp", "jti")


def verify_token(secret: str | None, token: str, *, now: float) -> dict[str, Any]:
    """The token's claims, if its signature is right and it has not expired. Raises
    ``Unauthorized`` otherwise (also when no secret is configured: every callback is
    refused then). Does not check the ``jti``: the caller spends it in the store."""
    if not secret:
        raise Unauthorized(
            "this hub has no callback secret configured, so it accepts no callbacks; set "
            "BACKCHANNEL_CALLBACK_SECRET (or callback_secret in the config file)"
        )
    try:
        raw_b64, sig_b64 = token.split(".")
        raw, sig = _unb64(raw_b64), _unb64(sig_b64)
    except (ValueError, TypeError):
        raise Unauthorized("malformed callback token: expected payload.signature") from None
    expected = hmac.new(secret.encode("utf-8"), raw, hashlib.sha256).digest()
    if not hmac.compare_digest(sig, expected):
        raise Unauthorized("callback token signature does not match")
    try:
        claims = json.loads(raw)
    except ValueError:
        raise Unauthorized("malformed callback token payload") from None
    if not isinstance(claims, dict) or any(k not in claims for k in _REQUIRED):
        raise Unauthorized("callback token lacks required claims")
    if not isinstance(claims["exp"], int | float) or claims["exp"] <= now:
        raise Unauthorized("callback token has expired")
    return claims


# -- retries -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Capped exponential backoff within a total time budget."""

    start: float = 1.0
    factor: float = 2.0
    cap: float = 15.0
    budget: float = 120.0
    timeout: float = 10.0  # one attempt

    def delay(self, attempt: int) -> float:
        """Wait before retry number ``attempt`` (1 = the first retry)."""
        return float(min(self.cap, self.start * self.factor ** max(0, attempt - 1)))


class Outcome(StrEnum):
    DONE = "done"
    RETRY = "retry"
    DEAD = "dead"


def classify(status: int | None) -> Outcome:
    """What an HTTP answer (``None``: no answer, a connection error) means for a retry."""
    if status is None:
        return Outcome.RETRY
    if 200 <= status < 300:
        return Outcome.DONE
    if status in (408, 425, 429) or status >= 500:
        return Outcome.RETRY
    return Outcome.DEAD  # other 4xx, and redirects, which are never followed


def next_try(policy: RetryPolicy, attempt: int, first_at: float, now: float) -> float | None:
    """When to try again after failed attempt ``attempt``, or ``None`` if the budget is spent."""
    at = now + policy.delay(attempt)
    return at if at - first_at <= policy.budget else None


# -- results ---------------------------------------------------------------------------


def timeout_error(d: Delegation) -> dict[str, str]:
    return {
        "error": f"{d.callee} did not answer within {d.deadline - d.created_at:.0f} s; "
        "if its answer comes later it will arrive as a late result",
        "reason": "timeout",
    }


#: How a delegation's error begins when the callee's hub never answered the task.
UNREACHABLE = "the callee's hub could not be reached"


def unreachable_error(service: str, cause: str) -> str:
    """A task for another hub (or A2A agent) that got no answer at all: the cause, and
    the way out, since nothing on the other side saw it."""
    return (
        f"{UNREACHABLE} (service {service!r}): {cause}. The task was not delivered: check "
        f"that the hub is running and that the address the callback registry gives for "
        f"{service!r} is right (BACKCHANNEL_CALLBACKS or the config file), then delegate again"
    )


def result_of(d: Delegation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "tool_use_id": d.tool_use_id,
        "delegation_id": d.delegation_id,
        "to": d.callee,
    }
    if d.state is DelegationState.TIMED_OUT:
        out.update(timeout_error(d))
    elif d.state is DelegationState.FAILED:
        # a task a conversation budget refused (on this hub, or the callee's: an A2A
        # task rejected, a 429) is told as a refusal: sent again, it is refused again
        # one whose hub was never reached is told so: the task may go through later
        if budget_refused(d.error):
            reason = "refused"
        elif (d.error or "").startswith(UNREACHABLE):
            reason = "unreachable"
        else:
            reason = "failed"
        out.update({"error": d.error or "the delegation failed", "reason": reason})
    else:
        out["result"] = d.result
        if not (d.result or "").strip():
            out["empty"] = True
    return out


def budget_refused(error: str | None) -> bool:
    """Whether a delegation's error is a conversation budget's refusal, whichever hub
    gave it: every route carries the refusal's own words, which begin ``not sent:``
    (:func:`backchannel.core.budget.pair_refusal`, :func:`~backchannel.core.budget.chain_refusal`)."""
    return error is not None and NOT_SENT in error


def answer_text(result: str | None) -> str:
    """An answer as the caller reads it: an empty one is said to be empty."""
    return result if result and result.strip() else EMPTY_ANSWER


def results_text(ds: Sequence[Delegation]) -> str:
    """The tool results of one turn's delegations, as the caller reads them."""
    parts = []
    for d in ds:
        r = result_of(d)
        head = f"Result of delegate(to={d.callee!r}) [{d.tool_use_id}]"
        body = answer_text(d.result) if "result" in r else f"ERROR ({r['reason']}): {r['error']}"
        parts.append(f"{head}:\n{body}")
    return "\n\n".join(parts)


def late_text(d: Delegation, why: str = "had timed out") -> str:
    return (
        f"Late result of delegate(to={d.callee!r}) [{d.tool_use_id}], which {why}:\n"
        f"{answer_text(d.result)}"
    )


def check_delegate(to: str, task: str, timeout_s: float | None) -> float:
    if not isinstance(task, str) or not task.strip():
        raise InvalidRequest("task is empty: say what the callee should do", field="task")
    t = DEFAULT_TIMEOUT if timeout_s is None else timeout_s
    if not isinstance(t, int | float) or not 1 <= t <= 86_400:
        raise InvalidRequest("timeout_s must be between 1 and 86400 seconds", field="timeout_s")
    return float(t)
