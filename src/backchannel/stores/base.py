"""The store contract.

A store keeps teams, members, sessions, messages and their deliveries. The hub never
talks to a database directly: it hands the store a *transaction function*, a plain
synchronous callable that receives a :class:`Tx` and reads and writes through it.

Guarantees every implementation gives (the conformance suite in
:func:`backchannel.testing.check_store` checks each of them):

* **Atomicity.** ``await store.transact(fn)`` runs ``fn(tx)`` in one transaction. If
  ``fn`` raises, none of its writes are visible to anyone, ever, and the exception
  propagates to the caller unchanged. If it returns, all of its writes are committed
  together before ``transact`` returns.
* **Durability.** When ``transact`` returns, the writes survive a crash of the
  process (``kill -9``) and, for the SQLite and PostgreSQL stores, loss of power. The
  SQLite store gets there by group commit: transaction functions that arrive while a
  commit is in flight share the next fsync.
* **Isolation.** Transaction functions behave as if run one at a time (serializable
  in effect): a function never sees another's partial writes.
* **No I/O from the function but the tx.** ``fn`` may run on another thread and may be
  re-run by a store that retries serialization failures, so it must not touch the
  outside world; it computes from what it reads and returns a value.

``Tx`` methods raise :class:`backchannel.errors.AlreadyExists` on a duplicate key, and
:class:`backchannel.errors.StoreError` (translated from the driver's error) when the
database fails.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from backchannel.types import (
    Delegation,
    Delivery,
    DeliveryEvent,
    DeliveryState,
    InboxMessage,
    Job,
    JobState,
    LedgerEntry,
    Link,
    Member,
    Message,
    Recipient,
    Session,
    SessionEvent,
    Team,
)

T = TypeVar("T")

#: Called by a store when it learns that another process changed the data, with the
#: team and member whose inbox may have new messages, or ``(None, None)`` for "anything".
ChangeCallback = Callable[[str | None, str | None], None]

SCHEMA_VERSION = 5


class Tx(Protocol):
    """Reads and writes inside one transaction. Every method is synchronous."""

    # -- teams -------------------------------------------------------------
    def get_team(self, name: str) -> Team | None: ...

    def insert_team(self, team: Team) -> None:
        """Add a team. Raises ``AlreadyExists`` if the name is taken."""

    def list_teams(self) -> list[Team]:
        """All teams, by name."""
        ...

    # -- members -----------------------------------------------------------
    def get_member(self, team: str, name: str) -> Member | None: ...

    def member_by_token_hash(self, token_hash: str) -> Member | None:
        """The member whose token hashes to ``token_hash`` (hashes are unique)."""
        ...

    def insert_member(self, member: Member) -> None:
        """Add a member. Raises ``AlreadyExists`` if the team already has the name."""

    def list_members(self, team: str) -> list[Member]:
        """The team's members, by name."""
        ...

    def update_member(self, member: Member) -> None:
        """Replace a member's ``delivery`` and ``settings`` (name, kind and token stay)."""

    # -- sessions ----------------------------------------------------------
    def get_session(self, team: str, session_id: str) -> Session | None: ...

    def put_session(self, session: Session) -> None:
        """Insert or replace the session with this ``(team, session_id)``."""

    def list_sessions(self, team: str, member: str | None = None) -> list[Session]:
        """Sessions of a team (or of one member), oldest first."""
        ...

    # -- messages ----------------------------------------------------------
    def get_message(self, team: str, message_id: str) -> Message | None: ...

    def insert_message(self, message: Message, recipients: Sequence[Recipient]) -> list[Delivery]:
        """Store a message and one ``queued`` delivery per recipient, with a ``queued``
        history event each.

        Deliveries get sequence numbers greater than any delivery stored before, so
        ordering by ``seq`` is send order. Raises ``AlreadyExists`` if the team already
        has this ``message_id``.
        """
        ...

    def lease(
        self,
        team: str,
        member: str,
        session: str | None,
        now: float,
        lease_until: float,
        limit: int,
        include_unpinned: bool = True,
    ) -> list[InboxMessage]:
        """Hand out up to ``limit`` of the member's ``queued`` deliveries, lowest ``seq``
        first, and mark them ``leased`` until ``lease_until`` with ``attempts + 1`` and a
        ``leased`` history event.

        Eligible are deliveries addressed to the member as a whole (unless
        ``include_unpinned`` is false) and, when ``session`` is given, those pinned to
        that session. Two concurrent leases never hand out the same delivery (on
        PostgreSQL: ``FOR UPDATE SKIP LOCKED``).
        """
        ...

    def expired_leases(self, now: float, limit: int) -> list[Delivery]:
        """Deliveries ``leased`` with ``lease_until <= now``, lowest ``seq`` first."""
        ...

    def next_lease_expiry(self) -> float | None:
        """The earliest ``lease_until`` among leased deliveries, or ``None``."""
        ...

    def transition(
        self,
        team: str,
        message_id: str,
        member: str,
        *,
        from_states: Sequence[DeliveryState],
        to_state: DeliveryState,
        now: float,
        event: str,
        detail: str = "",
        dead_reason: str | None = None,
    ) -> bool:
        """Move one delivery to ``to_state`` if it is in one of ``from_states``, recording
        a history event. Returns ``False`` (and writes nothing) if it was not."""
        ...

    def ack(self, team: str, member: str, message_ids: Sequence[str], now: float) -> list[str]:
        """Mark the member's ``leased`` or ``delivered`` copies of these messages
        ``acked``, with an ``acked`` history event. Idempotent: acking an acked copy is a
        no-op that still counts it as acked. Returns the ids that are now acked; ids the
        member holds no copy of, or whose copy is ``queued`` or ``dead``, are left out."""
        ...

    def first_message_from(
        self, team: str, sender: str, recipient: str, since: float
    ) -> Message | None:
        """The earliest message from ``sender`` with a copy for ``recipient``, created at
        or after ``since`` (``system`` messages from the hub excluded)."""
        ...

    def add_history(self, team: str, event: DeliveryEvent) -> None:
        """Append a line to a message's history (and the team feed) without changing any
        delivery, e.g. a reaction."""

    def deliveries(self, team: str, message_id: str) -> list[Delivery]:
        """Every copy of a message, by recipient name."""
        ...

    def history(self, team: str, message_id: str) -> list[DeliveryEvent]:
        """The message's delivery history, oldest first."""
        ...

    def feed(self, team: str, after: int, limit: int) -> list[tuple[int, DeliveryEvent]]:
        """History events of a team with a cursor greater than ``after``, oldest first.
        Cursors increase in commit order within one store; they drive live views."""
        ...

    def pending_count(self, team: str, member: str) -> int:
        """How many of the member's copies are ``queued`` or ``leased``."""
        ...

    # -- transcripts ---------------------------------------------------------
    def append_event(self, event: SessionEvent) -> int:
        """Append to a session's transcript; returns the new ``event_id``, greater than
        every event id stored before."""
        ...

    def list_events(
        self, team: str, session_id: str, after: int, until: int | None, limit: int
    ) -> list[SessionEvent]:
        """The session's events with ``after < event_id`` (and ``<= until`` when given),
        oldest first, at most ``limit``."""
        ...

    # -- the per-turn ledger -------------------------------------------------
    def ledger_add(self, entry: LedgerEntry) -> None:
        """Record a text the session sent this turn."""

    def ledger(self, team: str, session_id: str) -> list[LedgerEntry]:
        """The session's ledger, oldest first."""
        ...

    def ledger_clear(self, team: str, session_id: str) -> int:
        """Forget the session's ledger; returns how many entries were dropped."""
        ...

    # -- links ---------------------------------------------------------------
    def insert_link(self, link: Link) -> Link:
        """Store a new open link, unless an open link already joins the same member pair
        (``link.pair``): then store nothing and return that one. Safe under concurrency:
        two concurrent inserts for one pair leave exactly one open link."""
        ...

    def get_link(self, team: str, link_id: str) -> Link | None: ...

    def find_open_link(self, team: str, member_a: str, member_b: str) -> Link | None:
        """The open link joining two members (in either direction), if any."""
        ...

    def update_link(self, link: Link) -> None:
        """Replace a stored link's state, budget use, session binding and history."""

    def list_links(
        self, team: str, *, member: str | None = None, open_only: bool = False
    ) -> list[Link]:
        """A team's links (optionally those a member takes part in), oldest first."""
        ...

    # -- scheduled jobs ------------------------------------------------------
    def add_job(self, job: Job) -> int:
        """Store a pending job; returns its ``job_id``."""
        ...

    def get_job(self, team: str, job_id: int) -> Job | None: ...

    def due_jobs(self, now: float, limit: int) -> list[Job]:
        """Pending jobs with ``due_at <= now``, earliest first. Within the transaction
        they are claimed: a concurrent ``due_jobs`` (another hub) never returns them
        (PostgreSQL: ``FOR UPDATE SKIP LOCKED``). The caller finishes each one in the
        same transaction; if the transaction fails, they are due again."""
        ...

    def next_job_due(self) -> float | None:
        """The earliest ``due_at`` among pending jobs (a due-time index, not a scan)."""
        ...

    def finish_job(self, job_id: int, state: JobState, at: float) -> bool:
        """Move a pending job to ``done`` or ``cancelled``. False if it was not pending."""
        ...

    def list_jobs(
        self,
        team: str,
        *,
        session_id: str | None = None,
        kind: str | None = None,
        pending_only: bool = True,
    ) -> list[Job]:
        """A team's jobs, optionally of one session or kind, by ``due_at``."""
        ...

    def reschedule_job(self, job_id: int, due_at: float, payload: Mapping[str, Any]) -> bool:
        """Move a pending job to ``due_at`` with a new payload (a retry, or a lease while
        its work runs outside the transaction). False if it is not pending."""
        ...

    # -- delegation ----------------------------------------------------------
    def insert_delegation(self, d: Delegation) -> None:
        """Store a delegation. Raises ``AlreadyExists`` if the team has its id, or has one
        for the same ``(caller_session, tool_use_id)``."""

    def get_delegation(self, team: str, delegation_id: str) -> Delegation | None: ...

    def find_delegation(
        self,
        team: str,
        *,
        caller_session: str | None = None,
        tool_use_id: str | None = None,
        callee_session: str | None = None,
    ) -> Delegation | None:
        """The delegation with this ``(caller_session, tool_use_id)``, or the one whose
        callee runs in ``callee_session``."""
        ...

    def update_delegation(self, d: Delegation) -> None:
        """Replace a stored delegation's state, result and error."""

    def list_delegations(
        self, team: str, *, batch: str | None = None, member: str | None = None
    ) -> list[Delegation]:
        """A team's delegations (of one batch, or where a member is caller or callee),
        oldest first."""
        ...

    # -- one-time tokens -----------------------------------------------------
    def spend_token(self, jti: str, expires_at: float) -> bool:
        """Mark a token id spent. False if it was spent before (a replay). Ids may be
        forgotten once ``expires_at`` has passed, when the token is refused anyway."""
        ...


class Store(ABC):
    """A place the hub keeps everything. See the module docstring for the guarantees."""

    #: The URL the store was opened from, with any password removed.
    url: str = ""

    @abstractmethod
    async def open(self) -> None:
        """Connect and bring the schema to :data:`SCHEMA_VERSION`.

        Safe when several processes open the same database at once: migrations run
        exactly once. Raises ``StoreError`` if the database is newer than this code.
        """

    @abstractmethod
    async def close(self) -> None:
        """Finish in-flight transactions and release connections. Idempotent."""

    @abstractmethod
    async def transact(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one durable transaction and return its result (see module doc)."""

    async def read(self, fn: Callable[[Tx], T]) -> T:
        """Run a read-only ``fn``. Stores may serve it from a snapshot without a commit."""
        return await self.transact(fn)

    def on_external_change(self, callback: ChangeCallback) -> None:
        """Register ``callback`` for changes made by *other* processes or hosts.

        It is a wake-up hint only, never the source of truth: it may be late, repeated
        or spurious, and a store that cannot tell calls it on a slow timer. It is called
        on the event loop that called :meth:`open`.
        """
        self._change_callbacks.append(callback)

    @property
    def _change_callbacks(self) -> list[ChangeCallback]:
        cbs: list[ChangeCallback] | None = self.__dict__.get("_cbs")
        if cbs is None:
            cbs = []
            self.__dict__["_cbs"] = cbs
        return cbs

    def _emit_change(self, team: str | None, member: str | None) -> None:
        for cb in list(self._change_callbacks):
            cb(team, member)

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
