"""Credentials, removal and quota counts: SQL written once for SQLite and PostgreSQL.

The statements use ``?`` placeholders; each transaction class runs them through its own
``_lifecycle_exec`` (PostgreSQL swaps in ``%s`` and takes the team's lock first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backchannel.types import Delivery, DeliveryState, Recipient

#: Tables whose rows belong to one team (``team`` column); ``teams`` itself is keyed by name.
TEAM_TABLES = (
    "delivery_events",
    "deliveries",
    "messages",
    "session_events",
    "ledger",
    "jobs",
    "links",
    "delegations",
    "sessions",
    "budgets",
    "inbox_entries",
    "a2a_tasks",
    "a2a_claims",
    "dispatch_owners",
    "push_circuits",
    "members",
)
_UNDELIVERED = "('queued', 'leased')"
_COLS = (
    "team, message_id, member, session, seq, state, attempts, created_at, updated_at, "
    "lease_until, dead_reason"
)


class LifecycleSql:
    """The :class:`backchannel.stores.base.Tx` methods for credentials, removal and quota
    counts, over a ``_lifecycle_exec(sql, args, team)`` that returns a DB-API cursor."""

    #: The dialect's expression for the member a timer's payload names (the one its
    #: ``jobs_timers_member`` index is on).
    _TIMER_MEMBER_OF = ""

    def _lifecycle_exec(self, sql: str, args: Sequence[Any], team: str) -> Any:
        raise NotImplementedError

    def set_token_hash(self, team: str, name: str, token_hash: str) -> bool:
        cur = self._lifecycle_exec(
            "UPDATE members SET token_hash = ? WHERE team = ? AND name = ?",
            (token_hash, team, name),
            team,
        )
        return bool(cur.rowcount)

    def delete_member(self, team: str, name: str) -> bool:
        self._lifecycle_exec(
            "DELETE FROM push_circuits WHERE team = ? AND member = ?", (team, name), team
        )
        cur = self._lifecycle_exec(
            "DELETE FROM members WHERE team = ? AND name = ?", (team, name), team
        )
        return bool(cur.rowcount)

    def delete_team(self, name: str) -> int:
        row = self._lifecycle_exec(
            f"SELECT count(*) FROM deliveries WHERE team = ? AND state IN {_UNDELIVERED}",
            (name,),
            name,
        ).fetchone()
        for table in TEAM_TABLES:
            self._lifecycle_exec(f"DELETE FROM {table} WHERE team = ?", (name,), name)
        self._lifecycle_exec("DELETE FROM teams WHERE name = ?", (name,), name)
        return int(row[0])

    def undelivered(self, team: str, member: str, limit: int) -> list[Delivery]:
        rows = self._lifecycle_exec(
            f"SELECT {_COLS} FROM deliveries WHERE team = ? AND member = ? "
            f"AND state IN {_UNDELIVERED} ORDER BY seq LIMIT ?",
            (team, member, limit),
            team,
        ).fetchall()
        return [
            Delivery(
                team=r[0],
                message_id=r[1],
                recipient=Recipient(r[2], r[3]),
                seq=r[4],
                state=DeliveryState(r[5]),
                attempts=r[6],
                created_at=r[7],
                updated_at=r[8],
                lease_until=r[9],
                dead_reason=r[10],
            )
            for r in rows
        ]

    def queued_count(self, team: str, member: str, limit: int) -> int:
        row = self._lifecycle_exec(
            "SELECT count(*) FROM (SELECT 1 FROM deliveries WHERE team = ? AND member = ? "
            "AND state = 'queued' LIMIT ?) AS q",
            (team, member, limit),
            team,
        ).fetchone()
        return int(row[0])

    @classmethod
    def count_timers_sql(cls) -> str:
        """The statement ``count_timers`` runs (``?`` for its team, member and limit): on
        ``jobs_timers_member_pending``, whose WHERE names the kind and state word for
        word, so the member's fired and cancelled timers are never read."""
        return (
            "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE team = ? AND kind = 'timer' "
            f"AND {cls._TIMER_MEMBER_OF} = ? AND state = 'pending' AND NOT EXISTS "
            "(SELECT 1 FROM sessions s WHERE s.team = jobs.team "
            "AND s.session_id = jobs.session_id AND s.state = 'terminated') LIMIT ?) AS q"
        )

    def count_timers(self, team: str, member: str, limit: int) -> int:
        row = self._lifecycle_exec(self.count_timers_sql(), (team, member, limit), team).fetchone()
        return int(row[0])

    def count_jobs(self, team: str, session_id: str, kind: str, limit: int) -> int:
        row = self._lifecycle_exec(
            "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE team = ? AND session_id = ? "
            "AND kind = ? AND state = 'pending' LIMIT ?) AS q",
            (team, session_id, kind, limit),
            team,
        ).fetchone()
        return int(row[0])
