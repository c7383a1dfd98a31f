"""Which hub pushes which member's messages: one lease per member, kept in the store.

Several hubs (``serve`` processes on one PostgreSQL database, or on one SQLite file) may
each run a :class:`~backchannel.delivery.dispatcher.Dispatcher`. For every push member
the dispatcher asks :meth:`Ownership.claim` for the member's lease (``Tx.claim_dispatch``)
and runs the member's worker only while this hub holds it:

* a claim succeeds when nobody holds the lease, its owner gave it up, its
  ``lease_until`` has passed, or this hub already holds it (a renewal); the dispatcher
  claims on every scan, at least every quarter of the lease. Where hubs on several
  hosts share the store (PostgreSQL), a lease's start and end are the database's clock,
  read in the claiming transaction, not the hub's: hub clocks may differ by up to
  :data:`~backchannel.hub.maintenance.MAX_CLOCK_SKEW`, more than a lease lasts, and a
  hub ahead would otherwise take a live owner's member (two hubs pushing to one member);
* a hub that *starts* pushing to a member (a takeover, or a worker started again) returns
  the member's ``leased`` copies to the queue in the same transaction
  (``Tx.requeue_leased``), so copies a crashed owner held go out first, in send order;
* a worker pushes only while :meth:`Ownership.holds` says so: until
  :data:`PUSH_WINDOW` of the lease has passed since the claim began, on this hub's own
  clock. The rest of the lease is margin, so a hub that cannot renew (its store is
  unreachable, its process is frozen) stops pushing before another can take over (the
  window is measured on this hub's clock, the lease on the database's: only their rates
  need agree). With a clock that follows the wall clock the window also ends once that
  long has passed on the monotonic clock: a wall clock stepped back would otherwise keep
  it open for as long as it stepped (a step forward ends it early, as it ends the lease
  for the other hubs on one host);
* the worker's ``receive`` leases only while the store names this hub as the owner,
  checked in the leasing transaction: a hub that lost the member cannot lease new copies,
  whatever its clock says. So with every record the worker makes on a copy (delivered,
  acked, dead, released): a hub paused in the middle of a push until another took the
  member over changes nothing of the copy the new owner holds;
* a worker whose ``receive`` failed returns the member's leased copies to the queue
  (:meth:`Ownership.requeue`) before it leases again: the failed lease may have
  committed (its answer lost with the connection), leaving copies held by nobody;
* a hub that stops gracefully gives its leases up (:meth:`Ownership.release`), and the
  next scan of another hub takes them at once.

What a takeover can repeat is only a copy that was never acked: one the old owner was
pushing when it died (the adapters and the agents drop repeats by ``message_id``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from backchannel.stores.base import Tx

if TYPE_CHECKING:
    from backchannel.hub import Hub

__all__ = ["MIN_OWNERSHIP_S", "OWNERSHIP_S", "PUSH_WINDOW", "Ownership", "hub_id"]

log = logging.getLogger("backchannel.delivery.ownership")

#: Default length of a hub's lease on a member's push delivery, in seconds: a crashed
#: hub's members move to another hub within about this long.
OWNERSHIP_S = 10.0
#: The shortest lease ``serve --dispatch-lease`` takes. A hub renews every quarter of the
#: lease and pushes for 3/4 of it, so a renewal has half the lease to commit; on a busy
#: store (16 senders on a 2-core host) one took over a second, and a 2 s lease (a 1 s
#: margin) ran out while its hub was alive: pushing stopped and started again.
MIN_OWNERSHIP_S = 5.0
#: The part of the lease during which its holder pushes, from before the claim began;
#: the rest is margin for a renewal that is slow to commit, or a hub that stopped
#: renewing (its store unreachable, its process frozen).
PUSH_WINDOW = 0.75

Key = tuple[str, str]


def hub_id() -> str:
    """A name for this hub process, unique across hosts and restarts."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


def _database_now(tx: Tx) -> float | None:
    """The clock of the database hubs on several hosts share, read in ``tx``
    (PostgreSQL's, see :meth:`~backchannel.stores.base.Store.database_time`); ``None``
    for a store only hubs on one host open (their clock is the host's)."""
    clock = getattr(tx, "database_time", None)
    return float(clock()) if callable(clock) else None


class Ownership:
    """This hub's leases on members' push delivery (see the module docstring)."""

    def __init__(self, hub: Hub, *, owner: str | None = None, lease_s: float = OWNERSHIP_S):
        if lease_s <= 0:
            raise ValueError("the push-delivery lease must be positive")
        self.hub = hub
        self.owner = owner or hub_id()
        self.lease_s = lease_s
        self._until: dict[Key, float] = {}  # member -> when this hub stops pushing
        #: when the window of the last claim ends on the monotonic clock (see holds)
        self._until_mono = 0.0
        self._steady = getattr(hub.clock, "follows_wall_clock", True)

    def holds(self, key: Key) -> bool:
        """Whether this hub may push to the member now: its window, from before the
        claim, has not passed by the hub's clock, nor by the monotonic clock where the
        hub's clock is the wall clock (which may step back)."""
        if self._steady and time.monotonic() >= self._until_mono:
            return False
        return self.hub.clock.now() < self._until.get(key, 0.0)

    def held(self) -> list[Key]:
        """The members this hub claimed last and still holds, sorted."""
        return sorted(k for k in self._until if self.holds(k))

    async def claim(
        self, wanted: Iterable[Key], running: Collection[Key], drop: Iterable[Key] = ()
    ) -> set[Key]:
        """In one transaction: claim or renew the lease on every ``wanted`` member and
        give up those in ``drop``. Members not in ``running`` (no live worker here) have
        their leased copies returned to the queue as they are taken. Returns the members
        this hub holds now; the others are forgotten (their workers must stop)."""
        keys = sorted(set(wanted))
        gone = sorted(set(drop) - set(keys))
        now, started = self.hub.clock.now(), time.monotonic()
        owner, lease_s = self.owner, self.lease_s
        if not keys and not gone:
            self._until = {}
            return set()  # no push members: no transaction (and no commit) at all
        shared = getattr(self.hub.clock, "follows_wall_clock", True)

        def fn(tx: Tx) -> tuple[list[Key], list[tuple[Key, str | None, int]]]:
            got: list[Key] = []
            moved: list[tuple[Key, str | None, int]] = []
            # the leases start and end by the database's clock where hubs on several
            # hosts share it: by its own, a hub whose clock is off by more than the lease
            # (less than MAX_CLOCK_SKEW) would see the live owner's lease as run out, or
            # write one the others see so, and two hubs would push to one member
            database = _database_now(tx) if shared else None
            at = now if database is None else database
            for key in keys:  # sorted: PostgreSQL takes team locks in one order
                prev = tx.dispatch_owner(*key)
                if not tx.claim_dispatch(*key, owner, at, at + lease_s):
                    continue
                got.append(key)
                if prev is None or prev[0] != owner or key not in running:
                    back = tx.requeue_leased(*key, now, f"push delivery taken by {owner}")
                    moved.append((key, prev[0] if prev else None, len(back)))
            for key in gone:
                tx.release_dispatch(*key, owner)
            return got, moved

        got, moved = await self.hub.store.transact(fn)
        for (team, member), prev_owner, n in moved:
            if prev_owner not in (None, owner):
                log.warning("took over push delivery to %s/%s from hub %s; %d copies it held "
                            "go out again first", team, member, prev_owner, n)  # fmt: skip
            elif n:
                log.info("%s/%s: %d leased copies back in the queue before pushing",
                         team, member, n)  # fmt: skip
        held = set(got)
        stop_at = now + self.lease_s * PUSH_WINDOW
        self._until = dict.fromkeys(held, stop_at)
        self._until_mono = started + self.lease_s * PUSH_WINDOW
        return held

    async def requeue(self, key: Key, detail: str) -> int | None:
        """Return the member's leased copies to the queue, in one transaction, if the store
        still names this hub its owner (None if not). For a worker whose lease failed
        with an unknown outcome (the connection was lost while it committed): copies it
        may have leased are held by nobody, and would otherwise come back only when
        their lease ran out, after the messages sent later."""
        team, member = key
        now = self.hub.clock.now()
        owner = self.owner

        def fn(tx: Tx) -> int | None:
            row = tx.dispatch_owner(team, member)
            if row is None or row[0] != owner:
                return None
            return len(tx.requeue_leased(team, member, now, detail))

        return await self.hub.store.transact(fn)

    async def release(self) -> None:
        """Give up every lease this hub holds, so other hubs take them at once."""
        keys, self._until = sorted(self._until), {}
        if not keys:
            return
        owner = self.owner

        def fn(tx: Tx) -> None:
            for key in keys:
                tx.release_dispatch(*key, owner)

        try:
            await self.hub.store.transact(fn)
        except Exception as exc:
            log.warning("could not give up push delivery to %d members (%s); other hubs "
                        "take them over when the leases run out", len(keys), exc)  # fmt: skip
