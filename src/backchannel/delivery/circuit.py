"""The push circuit: which members' push targets are down, in this hub's memory.

A member's push target that failed a message's whole tries for a reason that says it
cannot be reached (a connection refused, an attempt that timed out; not a refusal of
that one message) is *down*: the dispatcher's worker opens the member's circuit here.
While it is open the worker does not give each queued message its own full tries (100
messages at 15 s each would hold the last sender for 25 minutes): it dead-letters what
is queued at once, with the reason, and tries the next message once, as a probe, at a
growing interval (:data:`PROBE_START_S` doubling to :data:`PROBE_MAX_S`). A probe that
is answered closes the circuit and delivery goes on in order. See docs/decisions.md
("A push target down for good").

The state is kept in the store (``push_circuits``, schema 17), so it is the same on every
hub that shares the store (PostgreSQL, or one SQLite file). Only the worker of the hub
that owns the member's push delivery (:mod:`.ownership`) writes it, while the member's
delivery setting is still that worker's (one that finds it changed stops), and only when
the circuit opens, a probe fails (the next probe's time and the interval after it), the
dead-lettering of what was queued ends, or a probe closes it: never per message sent.
What each hub shows:

* a send's ``warnings``: :meth:`PushCircuits.get` answers from this hub's own workers'
  circuits and from the stored ones as read at most :data:`CACHE_S` ago (one read of
  the table per hub that often, taken by the first send that finds the copy stale; not
  a query per send), so a send through any hub is warned, and one sent within
  :data:`CACHE_S` of a change may be told what was true just before it;
* the member's entry in ``GET /v1/teams/{team}/members`` (``push_circuit``;
  ``backchannel member list``), the dashboard, ``/metrics`` (``backchannel_push_down``)
  and ``backchannel doctor`` read the stored circuits afresh.

A hub that takes the member over (failover of the push lease, or its worker started
again) starts from the stored circuit when it names the same target: it waits for the
stored next probe, tries one message as the probe, and doubles the stored interval if
that fails; it never gives each queued message its full tries again. A stored circuit
for another target (the member's delivery setting changed) is dropped: changing the
setting forgets it in the same transaction, and deleting the member or team with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backchannel.stores.base import Store

__all__ = ["CACHE_S", "PROBE_MAX_S", "PROBE_START_S", "PushCircuit", "PushCircuits"]

log = logging.getLogger("backchannel.delivery.circuit")

#: The first probe of a down target comes this long after its circuit opened.
PROBE_START_S = 5.0
#: The longest interval between two probes (the interval doubles up to it).
PROBE_MAX_S = 120.0
#: How old the stored circuits a send's warning is drawn from may be, in seconds.
CACHE_S = 2.0


@dataclass
class PushCircuit:
    """One member's open circuit: where its push goes, why it is down, since when (hub
    clock), when the next probe is due (hub clock), and how many copies it dead-lettered
    without their own tries."""

    team: str
    member: str
    target: str
    reason: str
    down_since: float
    next_probe_at: float
    probes: int = 0
    dead_lettered: int = 0
    #: the interval after the next probe, if it fails too (halved: the one before it)
    probe_interval: float = PROBE_START_S

    def warning(self) -> str:
        """What a sender to this member is told."""
        return (
            f"push delivery to {self.member!r} is down: {self.target} failed ({self.reason}). "
            "The message waits for the next probe of the target and is dead-lettered, "
            "and you told, if that probe fails too; fix the target or change the member's "
            f"delivery setting (backchannel member list {self.team} shows it while it is "
            "down)"
        )

    def to_state(self) -> dict[str, Any]:
        """What the store keeps (``Tx.set_push_circuit``)."""
        return {**self.to_json(), "probe_interval": self.probe_interval}

    @classmethod
    def from_state(cls, team: str, member: str, state: dict[str, Any]) -> PushCircuit:
        """The circuit a hub stored (:meth:`to_state`)."""
        return cls(
            team,
            member,
            str(state.get("target", "")),
            str(state.get("reason", "")),
            down_since=float(state.get("down_since", 0.0)),
            next_probe_at=float(state.get("next_probe_at", 0.0)),
            probes=int(state.get("probes", 0)),
            dead_lettered=int(state.get("dead_lettered", 0)),
            probe_interval=float(state.get("probe_interval", PROBE_START_S)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "state": "down",
            "target": self.target,
            "reason": self.reason,
            "down_since": self.down_since,
            "next_probe_at": self.next_probe_at,
            "probes": self.probes,
            "dead_lettered": self.dead_lettered,
        }


class PushCircuits:
    """The open circuits one hub knows, by ``(team, member)``: those of its own workers
    (up to date) and the stored ones (read at most :data:`CACHE_S` ago for a send, afresh
    by :meth:`refresh` with ``max_age=0``)."""

    def __init__(self, store: Store | None = None, *, cache_s: float = CACHE_S) -> None:
        self._open: dict[tuple[str, str], PushCircuit] = {}
        self._store = store
        self._cache_s = cache_s
        self._stored: dict[tuple[str, str], PushCircuit] = {}
        self._read_at = float("-inf")  # monotonic time of the last read of the store
        self._lock = asyncio.Lock()

    def open(self, circuit: PushCircuit) -> None:
        self._open[(circuit.team, circuit.member)] = circuit

    def close(self, team: str, member: str, circuit: PushCircuit | None = None) -> None:
        """Forget the member's circuit (with ``circuit``: only if it is that one, so a
        worker that is stopping never forgets the circuit its successor opened). The
        stored copy is this hub's worker's to change, through the store."""
        if circuit is None or self._open.get((team, member)) is circuit:
            self._open.pop((team, member), None)
            self._stored.pop((team, member), None)

    def get(self, team: str, member: str) -> PushCircuit | None:
        key = (team, member)
        return self._open.get(key) or self._stored.get(key)

    def any(self) -> bool:
        """Some member's circuit is known to be open (a send's usual answer: none)."""
        return bool(self._open or self._stored)

    def stale(self, max_age: float | None = None) -> bool:
        """:meth:`refresh` would read the store (a check without a coroutine, for the
        send path)."""
        age = self._cache_s if max_age is None else max_age
        return self._store is not None and time.monotonic() - self._read_at >= age

    def all(self) -> list[PushCircuit]:
        both = {**self._stored, **self._open}
        return [both[k] for k in sorted(both)]

    async def refresh(self, max_age: float | None = None) -> None:
        """Read the stored circuits again if the last read is ``max_age`` seconds old or
        more (default :data:`CACHE_S`; 0: now). Callers that find it stale at once share
        one read; a read that fails keeps what was read before (a send is not refused
        for want of its warning)."""
        if self._store is None:
            return
        age = self._cache_s if max_age is None else max_age
        if time.monotonic() - self._read_at < age:
            return
        async with self._lock:
            started = time.monotonic()
            if started - self._read_at < age:
                return  # read while this one waited
            try:
                rows = await self._store.read(lambda tx: tx.push_circuits())
            except Exception as exc:
                log.debug("reading the stored push circuits failed: %s", exc)
                return
            self._stored = {(t, m): PushCircuit.from_state(t, m, s) for t, m, s in rows}
            self._read_at = started
