"""Per-member quotas applied inside transactions (limits in :mod:`backchannel.core.quotas`).

Counting a member's queue on every send would cost a query each time, so the room seen
at the last count is remembered per member, and counted again (bounded by the limit)
only once about half of it is used. With several hub processes a queue may overshoot by
what the others add between two counts. The remembered room is a cache across
transactions, never an effect of one: :meth:`Quotas.forget` drops it when limits or
members change.

Timers are counted every time, in the transaction that sets one, by one bounded query
(:meth:`~backchannel.stores.base.Tx.count_timers`: every pending timer of the member on
a session not terminated). A remembered room let each hub on one store, the CLI's own
included, hand out half the limit on its own (two hubs held 5 timers under a limit of
4), and kept a limit an administrator lowered on another hub from applying there. A
timer is set once a turn or so, not once a message: the count costs next to nothing.
"""

from __future__ import annotations

from backchannel.core import quotas
from backchannel.hub.context import Ctx
from backchannel.types import BROADCAST

__all__ = ["Quotas"]


class Quotas:
    """The inbox and timer quotas (see the module docstring)."""

    def __init__(self) -> None:
        self._inbox_room: dict[tuple[str, str], int] = {}  # sends left before a recount

    def forget(self) -> None:
        """Limits or members changed: count again next time."""
        self._inbox_room.clear()

    def check_inbox(self, c: Ctx, team: str, sender: str, to: str) -> None:
        """Refuse a send into an inbox at its quota (``QuotaExceeded``)."""
        tx = c.tx
        if to == BROADCAST:
            names = [m.name for m in tx.list_members(team) if m.name != sender]
        else:
            names = [to]
        for name in names:
            key = (team, name)
            room = self._inbox_room.get(key, 0)
            if room > 0:
                self._inbox_room[key] = room - 1
                continue
            member = tx.get_member(team, name)
            if member is None:
                continue  # refused by the send itself, with suggestions
            found = tx.get_team(team)
            cap = quotas.limit(quotas.MAX_QUEUED, found.settings if found else {}, member.settings)
            count = tx.queued_count(team, name, cap)
            if count >= cap:
                raise quotas.inbox_full(name, count, cap)
            if len(self._inbox_room) > 10_000:
                self._inbox_room.clear()
            self._inbox_room[key] = (cap - count) // 2

    def check_timers(self, c: Ctx, team: str, member: str) -> None:
        """Refuse a timer over the member's quota (``QuotaExceeded``): counted now, in
        this transaction, whichever hub set the member's other timers."""
        tx = c.tx
        found, me = tx.get_team(team), tx.get_member(team, member)
        cap = quotas.limit(
            quotas.MAX_TIMERS, found.settings if found else {}, me.settings if me else {}
        )
        count = tx.count_timers(team, member, cap)
        if count >= cap:
            raise quotas.too_many_timers(member, count, cap)
