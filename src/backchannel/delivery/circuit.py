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

The state lives in the memory of the hub whose dispatcher owns the member's push
delivery (no store column): the member's entry in ``GET /v1/teams/{team}/members``
(``push_circuit``; ``backchannel member list``), a send's ``warnings`` and ``/metrics``
(``backchannel_push_down``) show it on that hub. A hub that takes the member over starts closed and
opens again after one message's tries if the target is still down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PROBE_MAX_S", "PROBE_START_S", "PushCircuit", "PushCircuits"]

#: The first probe of a down target comes this long after its circuit opened.
PROBE_START_S = 5.0
#: The longest interval between two probes (the interval doubles up to it).
PROBE_MAX_S = 120.0


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

    def warning(self) -> str:
        """What a sender to this member is told."""
        return (
            f"push delivery to {self.member!r} is down: {self.target} failed ({self.reason}). "
            "The message waits for the next probe of the target and is dead-lettered, "
            "and you told, if that probe fails too; fix the target or change the member's "
            f"delivery setting (backchannel member list {self.team} shows it while it is "
            "down)"
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
    """The open circuits of one hub, by ``(team, member)``."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], PushCircuit] = {}

    def open(self, circuit: PushCircuit) -> None:
        self._open[(circuit.team, circuit.member)] = circuit

    def close(self, team: str, member: str, circuit: PushCircuit | None = None) -> None:
        """Forget the member's circuit (with ``circuit``: only if it is that one, so a
        worker that is stopping never forgets the circuit its successor opened)."""
        if circuit is None or self._open.get((team, member)) is circuit:
            self._open.pop((team, member), None)

    def get(self, team: str, member: str) -> PushCircuit | None:
        return self._open.get((team, member))

    def all(self) -> list[PushCircuit]:
        return [self._open[k] for k in sorted(self._open)]
