"""Per-member quotas applied inside transactions (limits in :mod:`backchannel.core.quotas`).

Counting a member's queue or timers on every send would cost a query each time, so the
room seen at the last count is remembered per member, and counted again (bounded by the
limit) only once about half of it is used. With several hub processes a queue may
overshoot by what the others add between two counts. The remembered room is a cache
across transactions, never an effect of one: :meth:`Quotas.forget` drops it when limits
or members change.
"""

from __future__ import annotations

from backchannel.core import quotas
from backchannel.core import timers as timer_rules
from backchannel.hub.context import Ctx
from backchannel.types import BROADCAST

__all__ = ["Quotas"]


class Quotas:
    """The inbox and timer quotas (see the module docstring)."""

    def __init__(self) -> None:
        self._inbox_room: dict[tuple[str, str], int] = {}  # sends left before a recount
        self._timer_room: dict[tuple[str, str], int] = {}  # timers left before a recount

    def forget(self) -> None:
        """Limits or members changed: count again next time."""
        self._inbox_room.clear()
        self._timer_room.clear()

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
        """Refuse a timer over the member's quota (``QuotaExceeded``)."""
        tx = c.tx
        key = (team, member)
        room = self._timer_room.get(key, 0)
        if room > 0:
            self._timer_room[key] = room - 1
            return
        found, me = tx.get_team(team), tx.get_member(team, member)
        cap = quotas.limit(
            quotas.MAX_TIMERS, found.settings if found else {}, me.settings if me else {}
        )
        count = 0
        # a session's pending timers are cancelled when it ends for good
        # (``Pipeline.terminated``): only the live ones can hold any
        for s in tx.list_sessions(team, member, which="live"):
            count += tx.count_jobs(team, s.session_id, timer_rules.TIMER_JOB, cap - count)
            if count >= cap:
                raise quotas.too_many_timers(member, count, cap)
        if len(self._timer_room) > 10_000:
            self._timer_room.clear()
        self._timer_room[key] = (cap - count) // 2
