"""The delivery adapter contract: how a push adapter puts one hub message in front of an agent.

The :class:`~backchannel.delivery.dispatcher.Dispatcher` runs one task per member whose
``delivery`` setting names a push adapter. That task leases the member's messages from
the hub (in send order, gated by the member's session when the setting names one), hands
each to the member's :class:`Adapter`, and records what happened::

    deliver() returns           -> hub.mark_delivered(detail), acked in its transaction
    deliver() raises AdapterError            -> capped backoff, hub.release, leased again
                                                (hub.give_up once the attempts or the
                                                retry budget are spent)
    deliver() raises PermanentDeliveryError  -> hub.give_up(reason): the copy is ``dead``
                                                and the sender is told
    deliver() raises HeldDelivery            -> hub.release at once (no backoff, no budget
                                                spent), a warning logged, the worker
                                                ``held``; it polls ready() and leases
                                                again once the medium is ready; held
                                                past ``hold_max``: hub.give_up
    any other exception                      -> logged with its traceback, then as AdapterError

Delivery is **at least once**. The hub records a delivery only after ``deliver`` returned,
so a crash (or a cancelled shutdown) between the write and the record leaves the copy
leased; when the lease runs out the hub hands it out again and the adapter writes it a
second time. Every adapter therefore writes the ``message_id`` where the reader can see it
and, where the medium allows, checks it first:

* ``inbox-file`` looks for the ``msg_id`` in the inbox and writes nothing if it is there;
* ``webhook`` sends the id in the body and as ``Idempotency-Key``; the receiver drops repeats;
* ``tmux`` and ``stdin`` cannot look back into what the agent already read: the window is
  the few milliseconds between the write and the hub's record, and a crash inside it
  shows the agent the message twice. Within one adapter ``tmux`` does remember: a retry
  after a paste whose ``Enter`` failed presses only ``Enter``.

An :class:`AdapterError` raised with ``tell_operator=True`` (part of the message was left
where only a person can finish or undo it) makes a give-up tell the team's ``user`` too.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from backchannel.core.delegation import RetryPolicy
from backchannel.errors import AdapterError, HeldDelivery, PermanentDeliveryError
from backchannel.runtimes.common import format_message
from backchannel.types import InboxMessage, Message

if TYPE_CHECKING:
    from backchannel.hub import Hub

__all__ = [
    "AUTO_SESSION",
    "DEFAULT_RETRY",
    "HOLD_MAX_S",
    "Adapter",
    "AdapterContext",
    "AdapterError",
    "HeldDelivery",
    "PermanentDeliveryError",
    "agent_text",
]

#: ``"session": "auto"``: follow the member's live session (the most recently active one
#: that is not terminated) instead of naming one.
AUTO_SESSION = "auto"

#: How long a copy may be held (:class:`HeldDelivery`: a dialog nobody answers, a shell in
#: the agent's pane) before it is given up, its sender told; the ``hold_max`` option.
HOLD_MAX_S = 1800.0

#: Backoff between attempts for adapters that do not bring their own policy.
DEFAULT_RETRY = RetryPolicy(start=0.5, factor=2.0, cap=10.0, budget=120.0, timeout=30.0)


@dataclass(frozen=True, slots=True)
class AdapterContext:
    """What an adapter is built from: the hub, the member it serves, and its setting."""

    hub: Hub
    team: str
    member: str
    setting: Mapping[str, Any] = field(default_factory=dict)
    #: the member's kind (``MemberKind`` value: ``"gemini"``...), "" when not known
    kind: str = ""

    def option(self, key: str, default: Any = None) -> Any:
        return self.setting.get(key, default)

    def str_option(self, key: str, default: str | None = None) -> str | None:
        """A string option; ``PermanentDeliveryError`` naming the fix if it is another type."""
        value = self.setting.get(key, default)
        if value is not None and not isinstance(value, str):
            raise PermanentDeliveryError(
                f"member {self.member!r}'s delivery setting {key!r} must be a string, "
                f"got {value!r}; correct the member's delivery setting"
            )
        return value

    def float_option(self, key: str, default: float) -> float:
        value = self.setting.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise PermanentDeliveryError(
                f"member {self.member!r}'s delivery setting {key!r} must be a non-negative "
                f"number, got {value!r}; correct the member's delivery setting"
            )
        return float(value)


class Adapter(abc.ABC):
    """One member's push adapter. The dispatcher owns it: :meth:`start` once, then
    :meth:`deliver` for one message at a time, in the member's send order (never two
    calls at once on one instance), then :meth:`close` once.

    Class attributes:

    * ``type``: the ``delivery.type`` that selects this adapter;
    * ``starts_turn``: a delivery becomes the agent's next input and starts a turn (tmux,
      stdin). With a session, the dispatcher then hands such an adapter one message per
      lease and, after each, waits up to ``turn_wait`` for the turn to be reported before
      leasing the next, so a second message is never typed in while the first one's turn
      is starting;
    * ``ack_on_delivery``: the agent cannot acknowledge by itself, so a delivered copy is
      acked at once (every adapter here).

    Instance attributes, readable after :meth:`start`: ``session`` (the hub session the
    dispatcher leases with: the hub holds messages back while that session's turn runs;
    :data:`AUTO_SESSION` to follow the member's live session; None for no gating),
    ``retry`` (backoff and budget for transient failures), ``attempt_timeout`` (the
    longest one :meth:`deliver` may take: the dispatcher's lease covers it plus the
    longest backoff, and the dispatcher cancels an attempt that runs a second past it),
    ``turn_wait`` and ``hold_max`` (how long a copy may be held, :class:`HeldDelivery`,
    before it is given up).
    """

    type: ClassVar[str] = ""
    starts_turn: ClassVar[bool] = False
    ack_on_delivery: ClassVar[bool] = True
    #: how long a copy may be held (the ``hold_max`` option, read by ``__init__``); a
    #: subclass that does not call it keeps this default
    hold_max: float = HOLD_MAX_S

    def __init__(self, ctx: AdapterContext) -> None:
        """Read and check the setting; raise :class:`PermanentDeliveryError` naming the fix
        when it is wrong. No I/O here: that belongs in :meth:`start`."""
        self.ctx = ctx
        self.session: str | None = ctx.str_option("session")
        self.retry: RetryPolicy = DEFAULT_RETRY
        self.attempt_timeout: float = DEFAULT_RETRY.timeout
        self.turn_wait: float = ctx.float_option("turn_wait", 0.0)
        self.hold_max = ctx.float_option("hold_max", HOLD_MAX_S)
        if not self.hold_max > 0 or not math.isfinite(self.hold_max):
            raise PermanentDeliveryError(
                f"member {ctx.member!r}'s delivery setting 'hold_max' must be a number of "
                f"seconds above 0, got {self.hold_max!r}; correct the member's delivery "
                f"setting (default {HOLD_MAX_S:g})"
            )

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Acquire what deliveries need (a process, a client). May set ``session``.
        Raising :class:`PermanentDeliveryError` dead-letters every message the member gets
        until the setting changes; :class:`AdapterError` makes the dispatcher retry."""

    @abc.abstractmethod
    async def deliver(self, item: InboxMessage) -> str:
        """Put one leased message in front of the agent; return a short detail for the
        delivery history (``"written to /path"``, ``"HTTP 200"``).

        Returns only once the message is where the agent reads it. Must be idempotent on
        ``item.message.message_id`` as far as the medium allows (see the module
        docstring): the same copy can be handed over again after a crash. Raises
        :class:`AdapterError` when a later attempt may succeed and
        :class:`PermanentDeliveryError` when none can. May be cancelled (at shutdown);
        the copy is then released and delivered again later.
        """

    async def ready(self) -> str | None:
        """Why a delivery would be held now (see :class:`HeldDelivery`), or None when it
        may be tried. Called while a copy is held, to know when to lease again; must not
        raise."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`start` acquired. Called once, also after a failed start."""

    def describe(self) -> str:
        """One line for logs and status: where this adapter delivers."""
        return f"{self.type} for {self.ctx.team}/{self.ctx.member}"


def agent_text(item: InboxMessage) -> str:
    """A message as an agent reads it (tmux, stdin, inbox files): a header line the hub
    writes, then the text escaped so it cannot forge one (:mod:`backchannel.core.framing`)."""
    return message_text(item.message)


def message_text(m: Message) -> str:
    """:func:`agent_text` of a message, whoever its copy is for."""
    return format_message(m.sender, m.kind.value, m.text)
