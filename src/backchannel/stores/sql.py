"""SQL fragments that SQLite and PostgreSQL share, written once.

Each SQL store builds its statements from these where the text is the same in both
dialects (placeholders aside); a fragment here must stay valid in both.
"""

from __future__ import annotations

from typing import Any

from backchannel.stores.base import SessionFilter

__all__ = ["OPEN_DELEGATION", "SESSION_FILTER", "links_query", "pg", "sessions_query"]

# Each filter matches a partial index's WHERE clause word for word (sessions_live,
# sessions_active), which is what lets SQLite's planner use that index.
SESSION_FILTER: dict[SessionFilter, str] = {
    "all": "",
    "live": " AND state != 'terminated'",
    "active": " AND state = 'active'",
}

# a delegation still waiting for its answer (the delegations_callee_open index's WHERE)
OPEN_DELEGATION = "state IN ('pending', 'timed_out')"


def pg(sql: str) -> str:
    """A statement written here (``?`` placeholders) in PostgreSQL's ``%s`` style. The
    statements here hold no literal ``?`` or ``%``."""
    return sql.replace("?", "%s")


def sessions_query(
    cols: str, team: str, member: str | None, which: SessionFilter, limit: int | None
) -> tuple[str, list[Any]]:
    """:meth:`Tx.list_sessions`: only the filters in use are named (an ``(? IS NULL OR
    member = ?)`` form would keep PostgreSQL's generic plans off the member indexes)."""
    sql = f"SELECT {cols} FROM sessions WHERE team = ?"
    args: list[Any] = [team]
    if member is not None:
        sql += " AND member = ?"
        args.append(member)
    sql += SESSION_FILTER[which] + " ORDER BY created_at, session_id"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return sql, args


def links_query(
    cols: str, team: str, member: str | None, open_only: bool
) -> tuple[str, tuple[Any, ...]]:
    """:meth:`Tx.list_links`: a member's links are one indexed search per side (an ``OR``
    of the two would read every open link of the team)."""
    sql = f"SELECT {cols} FROM links WHERE team = ?"
    state = " AND state = 'open'" if open_only else ""
    if member is None:
        return sql + state + " ORDER BY created_at, link_id", (team,)
    return (
        f"{sql} AND initiator = ?{state} UNION ALL "
        f"{sql} AND responder = ? AND initiator != ?{state} ORDER BY created_at, link_id",
        (team, member, team, member, member),
    )
