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
* **A caller that stops waiting is told how it ended.** A store whose threads run the
  transactions answers with a future, and runs a function whose caller was cancelled
  meanwhile all the same. Once it knows whether that transaction committed, it calls
  :func:`tell_finished` on the function (on the event loop), so the caller can still
  apply what the commit implies (the hub answers a receive its send leased messages
  for). A store that answers with a coroutine stops with its caller: what it ran then
  did not commit.

``Tx`` methods raise :class:`backchannel.errors.AlreadyExists` on a duplicate key, and
:class:`backchannel.errors.StoreError` (translated from the driver's error) when the
database fails.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from backchannel.types import (
    A2AClaim,
    A2ATask,
    Budget,
    Delegation,
    Delivery,
    DeliveryEvent,
    DeliveryState,
    InboxEntry,
    InboxMessage,
    Job,
    JobState,
    Lease,
    LedgerEntry,
    Link,
    Member,
    MemberActivity,
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

SCHEMA_VERSION = 25


@dataclass(frozen=True, slots=True)
class BudgetNeed:
    """Which budget records need a human (:meth:`Tx.budgets_for_human`), by the team's
    limits at one moment: a chain's whose hops reached ``chain_budget`` plus what was
    granted (spent), or that was granted more (extended); a pair's whose window began
    after ``window_from`` (it has not reset) and that is spent (``pair_budget``) or
    extended. The ``ctx:`` records never do."""

    pair_budget: int
    chain_budget: int
    window_from: float


#: Where retention goes on (:meth:`Tx.compact`): the ``(created_at, team, message_id)``
#: of the last message it examined. The key, not the time alone: any number of messages
#: may share one ``created_at`` (a batch sent in one transaction, a clock that stood).
CompactCursor = tuple[float, str, str]
#: The cursor before every message (times are seconds since the epoch, no team is named
#: ``""``): where a retention pass starts.
COMPACT_START: CompactCursor = (0.0, "", "")


def schema_put_back(store: str, version: int) -> str:
    """What to say when a statement finds a table or column missing and the database's
    schema is at ``version``, older than the one this code opened it at: it was put back
    (restored from an older backup) under the running hub. Restarting the hub migrates it
    again; until then nothing this code writes can be stored."""
    return (
        f"the store {store} is at schema version {version}, but this backchannel opened it "
        f"at {SCHEMA_VERSION}: the database was put back while the hub ran (restored from "
        "an older backup?); nothing was stored; restart the hub, which migrates it to "
        f"version {SCHEMA_VERSION} (what was written after that backup is not in it)"
    )


def schema_moved_on(store: str, version: int) -> str:
    """What to say when the database's schema is at ``version``, newer than this code's:
    a newer backchannel migrated it while this hub ran (a rolling upgrade). What this
    code would write next, the newer schema could misread (a column it does not fill,
    a rule it does not know), so it writes nothing more."""
    return (
        f"the store {store} is at schema version {version}, migrated by a newer "
        f"backchannel while this hub (which knows up to version {SCHEMA_VERSION}) ran; "
        "nothing was stored; stop this hub and run the newer backchannel in its place "
        "(upgrade backchannel on this host), so that no hub writes rows the new schema "
        "would misread"
    )


def tell_finished(fn: object, committed: bool) -> None:
    """A transaction function whose caller stopped waiting (its future was cancelled)
    was run: tell it whether it committed, if it asks (a ``finished`` method)."""
    finished = getattr(fn, "finished", None)
    if finished is not None:
        finished(committed)


SessionFilter = Literal["all", "live", "active"]
"""Which sessions :meth:`Tx.list_sessions` returns: every one, those not terminated, or
those with a turn running."""


@dataclass(frozen=True, slots=True)
class Reads:
    """What a transaction function is about to read about one team (:meth:`Tx.prefetch`):
    the rows a send's checks read, named before the first of them is asked for."""

    team: str
    members: tuple[str, ...] = ()
    budgets: tuple[str, ...] = ()
    #: the open link between these two members (:meth:`Tx.find_open_link`)
    link: tuple[str, str] | None = None
    #: a session by id (:meth:`Tx.get_session`)
    session: str | None = None
    #: this member's active sessions, at most two (``list_sessions(team, member,
    #: which="active", limit=2)``: is exactly one turn running?)
    active_of: str | None = None
    #: this member's live sessions (``list_sessions(team, member, which="live")``)
    live_of: str | None = None
    #: a message by id (:meth:`Tx.get_message`: a replay?)
    message: str | None = None
    #: this session's ledger (:meth:`Tx.ledger`: what its turn sent)
    ledger_of: str | None = None
    #: this member's open links (``list_links(team, member=..., open_only=True)``)
    links_of: str | None = None
    #: the delegation this session answers (``find_delegation(team, callee_session=...)``)
    delegation_of: str | None = None
    #: a caller turn's delegations (``list_delegations(team, batch=...)``)
    batch: str | None = None


class Tx(Protocol):
    """Reads and writes inside one transaction. Every method is synchronous."""

    #: whether :meth:`prefetch` does anything here: a caller builds its :class:`Reads`
    #: only then (on the stores where it does nothing, naming them would be pure cost
    #: on every send's path)
    prefetches: bool

    def prefetch(self, reads: Reads) -> None:
        """A hint: the function is about to read ``reads`` (and the team itself). A store
        whose every statement is a network round trip (PostgreSQL) asks them all at
        once and answers those reads from what it got until this transaction writes;
        the others do nothing. It changes no answer, only how many trips they take."""

    # -- teams -------------------------------------------------------------
    def get_team(self, name: str) -> Team | None: ...

    def insert_team(self, team: Team) -> None:
        """Add a team. Raises ``AlreadyExists`` if the name is taken."""

    def list_teams(self, *, after: str | None = None, limit: int | None = None) -> list[Team]:
        """The teams, by name: those whose name comes after ``after`` (a page's start: the
        last name of the page before), at most ``limit``, read from the primary key in
        that order."""
        ...

    def link_crossings(self, team: str) -> int:
        """How many crossings the team's links have made, summed in the store (what
        ``/metrics`` shows; no link is read out)."""
        ...

    def count_teams(self) -> int:
        """How many teams there are (the hub's own checks ask, never reading them)."""
        ...

    # -- members -----------------------------------------------------------
    def get_member(self, team: str, name: str) -> Member | None: ...

    def member_by_token_hash(self, token_hash: str) -> Member | None:
        """The member whose token hashes to ``token_hash`` (hashes are unique)."""
        ...

    def insert_member(self, member: Member) -> None:
        """Add a member. Raises ``AlreadyExists`` if the team already has the name."""

    def list_members(
        self, team: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Member]:
        """The team's members, by name: those whose name comes after ``after`` (a page's
        start: the last name of the page before), at most ``limit``, read from the
        primary key in that order."""
        ...

    def update_member(self, member: Member) -> None:
        """Replace a member's ``delivery`` and ``settings`` (name, kind and token stay)."""

    # -- sessions ----------------------------------------------------------
    def get_session(self, team: str, session_id: str) -> Session | None: ...

    def put_session(self, session: Session) -> None:
        """Insert or replace the session with this ``(team, session_id)``."""

    def list_sessions(
        self,
        team: str,
        member: str | None = None,
        *,
        which: SessionFilter = "all",
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Session]:
        """Sessions of a team (or of one member), oldest first: ``"all"``, the ``"live"``
        ones (not terminated) or the ``"active"`` ones (a turn running), at most
        ``limit``, those whose ``(created_at, session_id)`` comes after ``after`` (a
        page's start: the key of the last session of the page before). Served by an
        index per filter, so asking whether a member has exactly one live session
        (``limit=2``) or reading a page costs the same with ten sessions or ten thousand."""
        ...

    def session_counts(self, team: str) -> dict[str, int]:
        """How many sessions each member of the team has (members without any are left
        out), counted from an index: no session is read out."""
        ...

    def latest_sessions(self, team: str, member: str, limit: int) -> list[Session]:
        """A member's latest ``limit`` sessions, newest first, read from an index in that
        order (the dashboard's, however many the member opened)."""
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
        holder: str | None = None,
    ) -> list[InboxMessage]:
        """Hand out up to ``limit`` of the member's ``queued`` deliveries, lowest ``seq``
        first, and mark them ``leased`` until ``lease_until`` with ``attempts + 1`` and a
        ``leased`` history event; leased to ``holder`` (a receive its client named, for
        :meth:`held`), or to no named receive.

        Eligible are deliveries addressed to the member as a whole (unless
        ``include_unpinned`` is false) and, when ``session`` is given, those pinned to
        that session. Two concurrent leases never hand out the same delivery (on
        PostgreSQL: ``FOR UPDATE SKIP LOCKED``).
        """
        ...

    def held(
        self,
        team: str,
        member: str,
        holder: str,
        now: float,
        after: tuple[float, int] | None = None,
        limit: int | None = None,
    ) -> list[InboxMessage]:
        """The member's deliveries still ``leased`` (``lease_until`` after ``now``) by a
        lease to ``holder``, as :meth:`lease` handed them out (the same attempt; nothing
        changes), each with ``leased_at`` (its ``updated_at``: when it was leased), in
        the order they were leased: earliest ``updated_at`` first, then lowest ``seq``.
        With ``after`` (a ``(leased_at, seq)`` pair), only those after it in that order;
        with ``limit``, at most that many (a page: the next starts after the last one's
        pair). What a receive its client made again, its answer lost on the way, is
        answered, and what an event stream opened again sends first. An index of the
        named leases alone finds them."""
        ...

    def held_again(
        self,
        team: str,
        member: str,
        holder: str,
        now: float,
        limit: int,
        after: tuple[float, int] | None = None,
    ) -> list[InboxMessage]:
        """What :meth:`held` answers (from the first, or after ``after`` as :meth:`held`
        takes it: a page; at most ``limit``), for a receive its
        client made again under the name ``holder``: each copy answered is handed to that
        receive anew, under a lease of its own: its ``lease_until`` moves up by the
        smallest step a float takes (``math.nextafter``; its attempt, ``updated_at`` and
        order stay), and each comes with that new ``lease_until``. A give-back of the
        lease it had (``transition(lease=...)``, another hub's receive cancelled as it
        leased) then finds it under that lease no more and leaves it with the client."""
        ...

    def expired_leases(self, now: float, limit: int) -> list[Delivery]:
        """Deliveries ``leased`` with ``lease_until <= now``, the earliest expiry first
        (then lowest ``seq``): the order of the lease-expiry index, so no store has to
        sort or scan the deliveries that are not leased."""
        ...

    def next_lease_expiry(self) -> float | None:
        """The earliest ``lease_until`` among leased deliveries, or ``None``."""
        ...

    def restart_leases(
        self, now: float, given_after: float, limit: int, given_before: float = 1e15
    ) -> list[Delivery]:
        """Up to ``limit`` leases given after ``given_after`` and before ``given_before``
        (their ``updated_at``) run their length again from ``now``: their
        ``lease_until`` becomes ``now + lease_until - updated_at`` and their
        ``updated_at`` ``now``. Returns them as they were. Without this, a lease given
        before the wall clock stepped back an hour would hold its message an hour (given
        after now: by a clock that has stepped back since), and one given before it
        stepped forward an hour would be taken from its receiver at once (given before
        now minus the step)."""
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
        refund: bool = False,
        lease: Lease | None = None,
    ) -> bool:
        """Move one delivery to ``to_state`` if it is in one of ``from_states``, recording
        a history event. Returns ``False`` (and writes nothing) if it was not. With
        ``refund``, its ``attempts`` goes down by one (not below 0): a lease the hub gives
        back without having handed the copy to anyone (its own clean stop, a receive
        that never answered) is no attempt. With ``lease``, only while the delivery is
        still under that lease: leased to ``lease.holder`` (``None``: to no named
        receive), ``attempts`` equal to ``lease.attempt`` and ``lease_until`` equal to
        ``lease.until``; a copy leased again since, or answered again to its receive
        (:meth:`held_again`), is under another lease and is left as it is."""
        ...

    def ack(self, team: str, member: str, message_ids: Sequence[str], now: float) -> list[str]:
        """Mark the member's ``leased`` or ``delivered`` copies of these messages
        ``acked``, with an ``acked`` history event, and its ``queued`` copies that were
        handed out before (``attempts`` > 0: a lease ran out or was given back while the
        receiver worked, and its ack came late; taking it spares the model the copy a
        second time). Idempotent: acking an acked copy is a no-op that still counts it
        as acked. Returns the ids that are now acked; ids the member holds no copy of,
        or whose copy was never handed out or is ``dead``, are left out."""
        ...

    def first_message_from(
        self, team: str, sender: str, recipient: str, since: float
    ) -> Message | None:
        """The earliest message from ``sender`` with a copy for ``recipient``, created at
        or after ``since`` (``system`` messages from the hub excluded). Its cost grows
        with the messages created since ``since``: it is asked for a moment just past
        (a timer being set), never for a long stretch of time."""
        ...

    def unread_from(self, team: str, member: str, sender: str, limit: int) -> list[Message]:
        """Up to ``limit`` messages from ``sender`` whose copy for ``member`` is still
        ``queued`` (never handed out: its model has not read it), oldest copy first.
        Served by the index of the queued copies: its cost is the member's queue."""
        ...

    def add_history(self, team: str, event: DeliveryEvent) -> None:
        """Append a line to a message's history (and the team feed) without changing any
        delivery. Not for reactions: :meth:`add_reaction` records those, once."""

    def add_reaction(self, team: str, event: DeliveryEvent) -> bool:
        """Append a reaction (``event`` named ``reaction``, its detail the emoji) to a
        message's history unless that member's reaction with that emoji is there
        already; False when it was. The database enforces it (SQLite and PostgreSQL: the
        unique index ``delivery_events_reaction``), so two transactions recording the
        same reaction at once record it once, whatever locks they took."""
        ...

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

    def feed_start(self, team: str, last: int) -> int:
        """The cursor the team's latest ``last`` history events follow: ``feed(team,
        cursor, last)`` returns exactly them; 0 when the team has no more than ``last``
        (``feed`` from 0 returns them all). A view that keeps only the latest events
        starts here rather than at 0. Served by an index: its cost grows with ``last``,
        never with the team's history (many dashboards opening ask it at once)."""
        ...

    def feed_removed(self, team: str) -> int:
        """The largest cursor of the team's history events that retention removed
        (:meth:`compact`), 0 if none: a feed reader whose cursor is below it did not see
        some events it will never be sent, since some event after its cursor is gone."""
        ...

    def dead_letters(self, team: str, limit: int) -> tuple[list[Delivery], int]:
        """The team's latest ``limit`` copies in state ``dead`` (the latest given up on
        first, by ``updated_at``, then ``seq``), and how many it holds in all. Served by
        an index of the dead copies alone, so its cost is theirs, not the team's."""
        ...

    def pending_count(self, team: str, member: str) -> int:
        """How many of the member's copies are ``queued`` or ``leased``."""
        ...

    def pending_counts(self, team: str) -> dict[str, int]:
        """How many copies each member of the team has ``queued`` or ``leased``
        (members with none are left out), counted from an index of those copies alone:
        the acked and dead ones, however many, are not read (``/metrics`` asks on every
        scrape)."""
        ...

    # -- push delivery ownership ---------------------------------------------
    def claim_dispatch(
        self, team: str, member: str, owner: str, now: float, lease_until: float
    ) -> bool:
        """Take or renew ``owner``'s lease on pushing the member's messages: the one hub
        that may run the member's push delivery until ``lease_until``.

        True, with the lease now held by ``owner`` until ``lease_until``, when nobody
        held it, it was released, its ``lease_until`` is at or before ``now`` (its owner
        stopped renewing it), or ``owner`` already held it. False, writing nothing, while
        another owner's lease runs. Two concurrent claims of one member never both
        succeed against a live lease: exactly one owner holds it at any time."""
        ...

    def release_dispatch(self, team: str, member: str, owner: str) -> bool:
        """Give up ``owner``'s lease on the member's push delivery at once, so another
        hub may claim it without waiting for it to run out. False (and nothing changes)
        if ``owner`` did not hold it."""
        ...

    def dispatch_owner(self, team: str, member: str) -> tuple[str, float] | None:
        """Who holds the lease on the member's push delivery and until when, expired or
        not; ``None`` if nobody does (never claimed, or released)."""
        ...

    def push_circuit(self, team: str, member: str) -> dict[str, Any] | None:
        """The member's push circuit as the hub that owns its push delivery stored it
        while the target is down (:mod:`backchannel.delivery.circuit`), ``None`` while
        it is up."""
        ...

    def push_circuits(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every stored push circuit as ``(team, member, state)``, sorted: the members
        whose push target is down, whichever hub found it."""
        ...

    def set_push_circuit(self, team: str, member: str, state: Mapping[str, Any] | None) -> None:
        """Store the member's push circuit (``state``, a JSON object), or forget it
        (``None``: the target answered, or the member's delivery setting changed)."""
        ...

    def requeue_leased(self, team: str, member: str, now: float, detail: str) -> list[str]:
        """Return every ``leased`` copy of the member's messages (pinned to a session or
        not) to ``queued`` at once, each with a ``released`` history event carrying
        ``detail``; attempts are kept. Returns their ids, lowest ``seq`` first. A hub
        that takes over a member's push delivery calls this in the transaction that gives
        it the lease, so the copies the previous owner held go out again before anything
        newer: order is kept, and a copy is pushed again only if it was never acked."""
        ...

    def unpin_session(
        self, team: str, member: str, session: str, now: float, detail: str
    ) -> list[str]:
        """The member's ``queued`` and ``leased`` copies pinned to ``session`` become the
        member's as a whole (their state, attempts and lease are kept), each with an
        ``unpinned`` history event carrying ``detail``. Returns their ids, lowest
        ``seq`` first. A session that ended for good calls this: nothing could lease a
        copy pinned to it any more."""
        ...

    # -- transcripts ---------------------------------------------------------
    def append_event(self, event: SessionEvent) -> int:
        """Append to a session's transcript; returns the new ``event_id``, greater than
        every event id stored before."""
        ...

    def note_event(self, event: SessionEvent) -> object:
        """As :meth:`append_event`, for a caller that needs no id back: a store whose
        statements are round trips (PostgreSQL) sends it with its next statement. What
        it returns means nothing (SQLite's is :meth:`append_event` itself)."""
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

    def ledger_forget(self, team: str, session_id: str) -> None:
        """As :meth:`ledger_clear`, for a caller that needs no count back: a store whose
        statements are round trips (PostgreSQL) sends it with its next statement."""
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
        self,
        team: str,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[Link]:
        """A team's links (optionally those a member takes part in), oldest first: those
        whose ``(created_at, link_id)`` comes after ``after`` (a page's start), at most
        ``limit``, read from an index in that order."""
        ...

    def latest_closed_links(self, team: str, limit: int) -> list[Link]:
        """The team's latest ``limit`` closed links, newest first, read from an index in
        that order (the dashboard's, however many the team closed)."""
        ...

    def count_closed_links(self, team: str) -> int:
        """How many closed links the team has, counted from indexes: no link is read."""
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

    def job_by_request(self, team: str, session_id: str, kind: str, request_id: str) -> Job | None:
        """The session's job of ``kind`` whose payload carries ``request_id`` (the
        caller's idempotency key), whatever its state; the lowest id if several do. An
        index search on that key (SQLite and PostgreSQL: ``jobs_request``), so its cost
        does not grow with the jobs the session had within the retention window."""
        ...

    def next_job_due(self) -> float | None:
        """The earliest ``due_at`` among pending jobs (a due-time index, not a scan)."""
        ...

    def last_job_id(self) -> int:
        """The highest job id among the stored jobs (0: none): every job added later
        has a higher one. One read of the id's index; maintenance reads it each pass, so
        after a step of the wall clock it knows which jobs were set before the step."""
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
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Job]:
        """A team's jobs, optionally of one session or kind, by ``due_at``: the first
        ``limit`` (all when None) after skipping ``offset`` (which needs a ``limit``;
        ``ValueError`` without one). The pending jobs of one kind are read from an index
        in that order, no further than ``offset + limit``."""
        ...

    def count_pending_jobs(self, team: str, kind: str) -> int:
        """How many of the team's jobs of ``kind`` are pending, counted from an index of
        the pending jobs alone (the dashboard's count of timers): no finished job is
        visited and no job is read out."""
        ...

    def pending_job_attempts(self, team: str, kind: str) -> int:
        """The sum of the ``attempt`` their payloads hold (0 where none) over the team's
        pending jobs of ``kind``, summed in the store: no payload is handed back
        (``/metrics``' retries of callback posts, whose payloads carry the answer)."""
        ...

    def list_timers(
        self,
        team: str,
        *,
        member: str | None = None,
        session_id: str | None = None,
        pending_only: bool = True,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Job]:
        """A team's timer jobs (kind ``timer``) in the order they were set (by id):
        those with an id above ``after``, at most ``limit`` (all when None); only the
        pending ones unless ``pending_only`` is False; optionally only those of
        ``member`` (the member its payload names) or of one session. Read from an index
        in id order for each filter, so a page costs what it returns however many timers
        the team holds."""
        ...

    def reschedule_job(self, job_id: int, due_at: float, payload: Mapping[str, Any]) -> bool:
        """Move a pending job to ``due_at`` with a new payload (a retry, or a lease while
        its work runs outside the transaction). False if it is not pending."""
        ...

    def watching(self, team: str, sender: str) -> Sequence[Job]:
        """The team's pending jobs that watch ``sender`` (``Job.watch``), by id. Asked on
        every send, so a store answers it without growing with the team's jobs (the
        SQLite writer keeps the answer until a job changes)."""
        ...

    def end_watch(self, job_id: int, payload: Mapping[str, Any]) -> bool:
        """The message a pending job watched for came: clear its ``watch`` and give it
        ``payload``. False if the job is not pending or watches nobody."""
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
        callee runs in ``callee_session`` (when a session answers several, the oldest that
        is still ``pending`` or ``timed_out``, else the oldest)."""
        ...

    def update_delegation(self, d: Delegation) -> None:
        """Replace a stored delegation's state, result, error, callee session, and its
        start and deadline (moved with a step of the wall clock)."""

    def list_delegations(
        self,
        team: str,
        *,
        batch: str | None = None,
        member: str | None = None,
        peer: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
        pending_only: bool = False,
    ) -> list[Delegation]:
        """A team's delegations (of one batch, or where a member is caller or callee, and
        with ``peer`` only those between the member and that peer; with
        ``pending_only``, those still pending), oldest first: those
        whose ``(created_at, delegation_id)`` comes after ``after`` (a page's start), at
        most ``limit``, read from an index in that order."""
        ...

    def delegations_by_state(
        self, team: str, *, pending: bool, member: str | None = None, limit: int | None = None
    ) -> list[Delegation]:
        """A team's pending delegations, oldest first, or (``pending=False``) its finished
        ones, newest first, at most ``limit``; with ``member``, those it is caller or
        callee of. Read from indexes in that order: the dashboard's, however many
        delegations the team keeps."""
        ...

    def count_delegations(self, team: str, *, member: str | None = None) -> dict[str, int]:
        """How many delegations the team keeps (``member``'s: as caller or callee) in each
        state that has any, counted from indexes."""
        ...

    def prune_delegations(self, team: str, *, ended_before: float, expired_before: float) -> int:
        """Forget a team's delegations that are over, with their stored reply tokens: those
        that ended (``answered_at``, else ``deadline``) before ``ended_before``, whose
        ``deadline`` is before ``expired_before`` (no reply token for them is still
        accepted), and none of whose batch is still ``pending``. Returns how many."""
        ...

    # -- credentials, removal, quota counts ----------------------------------
    def set_token_hash(self, team: str, name: str, token_hash: str) -> bool:
        """Replace a member's token hash (a rotation): the old token stops matching in
        this transaction. False if there is no such member."""
        ...

    def delete_member(self, team: str, name: str) -> bool:
        """Remove the member's row (its token stops matching). Its messages, deliveries,
        sessions and links stay: the hub settles them first. False if it did not exist."""
        ...

    def delete_team(self, name: str) -> int:
        """Remove a team and every row that belongs to it (members, sessions, messages,
        deliveries, history, transcripts, ledgers, jobs, links, delegations). Returns
        how many copies were still ``queued`` or ``leased`` (dropped with it)."""
        ...

    def undelivered(self, team: str, member: str, limit: int) -> list[Delivery]:
        """Up to ``limit`` of the member's ``queued`` or ``leased`` copies, lowest ``seq``
        first."""
        ...

    def queued_count(self, team: str, member: str, limit: int) -> int:
        """How many of the member's copies are ``queued``, counted no further than
        ``limit`` (a quota check: the cost is bounded by the limit)."""
        ...

    def count_jobs(self, team: str, session_id: str, kind: str, limit: int) -> int:
        """How many of the session's jobs of ``kind`` are ``pending``, counted no further
        than ``limit``."""
        ...

    def count_timers(self, team: str, member: str, limit: int) -> int:
        """How many ``pending`` jobs of kind ``timer`` the member holds (the member its
        payload names), over all its sessions but the terminated ones (a timer left
        pending on one fires nothing), counted no further than ``limit``: one query,
        however many sessions the member has."""
        ...

    # -- one-time tokens -----------------------------------------------------
    def compact(
        self, before: float, after: CompactCursor | None, limit: int
    ) -> tuple[int, CompactCursor | None]:
        """Retention. Examines up to ``limit`` messages created before ``before`` that
        come after ``after`` in ``(created_at, team, message_id)`` order (from the oldest
        when ``after`` is None), in that order, and removes those whose every copy is ``acked`` or ``dead`` and was
        last changed before ``before`` too, with their copies and delivery history; a
        message with a copy still queued, leased or delivered is kept, whatever its age,
        and one acked after a long wait is kept a retention period from its ack (its
        sender still sees it delivered, a feed reader still sees its last events). Also removes jobs that finished (done or
        cancelled) before ``before``. Returns how many messages were removed and the
        cursor of the last one examined, where the next call goes on (``None`` once none
        is left before ``before``): every call advances, however many messages share
        one ``created_at``. Each call is bounded by ``limit``. The largest cursor of the
        history events it removes is kept as the team's :meth:`feed_removed`."""
        ...

    def spend_token(self, jti: str, expires_at: float) -> bool:
        """Mark a token id spent. False if it was spent before (a replay). Ids may be
        forgotten once ``expires_at`` has passed, when the token is refused anyway."""
        ...

    def prune_spent_tokens(self, now: float) -> int:
        """Forget spent token ids whose ``expires_at`` is at or before ``now``. Returns how
        many."""

    # -- Claude Code inbox files read back -----------------------------------
    def inbox_known(self, team: str, inbox: str, entry_ids: Sequence[str]) -> set[str]:
        """Which of ``entry_ids`` are recorded for ``(team, inbox)``."""
        ...

    def inbox_record(self, entries: Sequence[InboxEntry]) -> None:
        """Record entries as taken in. An id already recorded for its inbox is kept as it
        was (idempotent), so a retried transaction changes nothing."""

    def inbox_activity(self, team: str) -> list[MemberActivity]:
        """Per sender of recorded entries (``kind`` other than ``"hub"`` and
        ``"skipped"``): the latest ``at`` and its kind, and the latest ``at`` of an entry
        with ``terminates``. By member name."""
        ...

    def inbox_forget(self, team: str, inbox: str, before: float, keep: Collection[str]) -> int:
        """Drop the records of ``inbox`` seen before ``before`` whose id is not in
        ``keep`` (the ids still in the file); the number dropped."""

    # -- conversation budgets ----------------------------------------------
    def get_budget(self, team: str, key: str) -> Budget | None:
        """A pair's or chain's budget record (see :class:`backchannel.types.Budget`)."""
        ...

    def put_budget(self, budget: Budget) -> None:
        """Insert or replace the record with the same ``(team, key)``."""

    def list_budgets(
        self,
        team: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        hidden: str | None = None,
    ) -> list[Budget]:
        """The team's budget records, ordered by key: those whose key comes after
        ``after`` (a page's start), at most ``limit``, without those whose key starts
        with ``hidden``; read from the primary key in that order."""

    def budgets_for_human(
        self, team: str, need: BudgetNeed, *, offset: int = 0, limit: int | None = None
    ) -> list[Budget]:
        """The team's budgets that need a human (spent, or extended: ``need``), the most
        recently updated first (then by key, backwards), from the ``offset``-th, at most
        ``limit``: read from an index in that order, so a page costs what it shows and
        the team's pairs and members, never its history of spent chains."""
        ...

    def count_budgets_for_human(self, team: str, need: BudgetNeed) -> int:
        """How many budgets :meth:`budgets_for_human` has in all (index entries alone)."""
        ...

    # -- A2A tasks -----------------------------------------------------------
    def put_a2a_task(self, task: A2ATask) -> None:
        """Insert or replace the task ``(team, task_id)``."""

    def get_a2a_task(self, team: str, task_id: str) -> A2ATask | None: ...

    def list_a2a_tasks(self, team: str, member: str, owner: str) -> list[A2ATask]:
        """The tasks ``owner`` gave ``member``, most recently updated first."""
        ...

    def claim_a2a_message(self, claim: A2AClaim) -> A2AClaim:
        """Claim ``(team, message_id)`` for ``claim.task_id`` unless it is claimed
        already; the claim that holds it either way (the first one stands)."""
        ...

    def get_a2a_claim(self, team: str, message_id: str) -> A2AClaim | None:
        """The claim on ``(team, message_id)``, ``None`` if there is none."""
        ...


class Store(ABC):
    """A place the hub keeps everything. See the module docstring for the guarantees."""

    #: The URL the store was opened from, with any password removed.
    url: str = ""
    #: What tells this store from every other, the same for every process that opens
    #: it, however it reaches it (another host name, another path to the file): set by
    #: :meth:`open` from the id kept in the store (``store_identity``, made once with
    #: the store) and, for a store a copy could be made of, where its data lies now (a
    #: SQLite file's device and inode, a PostgreSQL database's oid), so a copy of the
    #: store beside it is another. Empty until the store is open.
    identity: str = ""

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
    def transact(self, fn: Callable[[Tx], T]) -> Awaitable[T]:
        """Run ``fn`` in one durable transaction; the awaitable gives its result (see
        module doc). A store may answer with a future of its own rather than a
        coroutine: every send awaits at least one. A store whose threads run the
        transactions answers with a future, and tells a function whose caller stopped
        waiting how it ended (:func:`tell_finished`)."""

    def transact_each(self, fns: Sequence[Callable[[Tx], T]]) -> Awaitable[list[T | Exception]]:
        """Run each of ``fns`` as :meth:`transact` runs it, in the order given (each sees
        what those before it wrote), as one call: the answer is, in order, each one's
        result, or the exception it raised (it alone is undone). Stores may commit
        several of them together. Anything but an ``Exception`` (a cancellation) is
        raised, not answered. A future, as :meth:`transact` answers, from a store whose
        threads run them."""
        return self._each(fns)

    async def _each(self, fns: Sequence[Callable[[Tx], T]]) -> list[T | Exception]:
        done: list[T | Exception] = []
        for fn in fns:
            try:
                done.append(await self.transact(fn))
            except Exception as exc:
                done.append(exc)
        return done

    def read(self, fn: Callable[[Tx], T]) -> Awaitable[T]:
        """Run a read-only ``fn``. Stores may serve it from a snapshot without a commit."""
        return self.transact(fn)

    async def database_time(self) -> float | None:
        """The clock of a database hubs on several hosts share (PostgreSQL's), in Unix
        seconds, for each hub to compare its own with; ``None`` for a store only hubs on
        one host open (their clock is the host's)."""
        return None

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
