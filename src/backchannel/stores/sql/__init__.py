"""SQL that SQLite and PostgreSQL share, written once.

Here: the fragments and the statements whose shape depends on the call (which filters
are given); :mod:`.statements` holds every fixed statement the two stores share and
:mod:`.rows` the column lists and row mappers. Everything here must stay valid in both
dialects; it is written with ``?`` placeholders (see :func:`pg`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from backchannel.stores.base import SessionFilter
from backchannel.types import DelegationState

__all__ = [
    "CLOSED_LINKS_COUNT",
    "LATEST_CLOSED_LINKS",
    "LATEST_SESSIONS",
    "OPEN_DELEGATION",
    "SESSION_COUNTS",
    "SESSION_FILTER",
    "delegation_counts",
    "delegation_counts_query",
    "delegations_by_state_query",
    "delegations_query",
    "jobs_query",
    "links_query",
    "pg",
    "sessions_query",
    "timers_query",
]

# Each filter matches a partial index's WHERE clause word for word (sessions_live,
# sessions_active), which is what lets SQLite's planner use that index.
SESSION_FILTER: dict[SessionFilter, str] = {
    "all": "",
    "live": " AND state != 'terminated'",
    "active": " AND state = 'active'",
}

# a delegation still waiting for its answer (the delegations_callee_open index's WHERE)
OPEN_DELEGATION = "state IN ('pending', 'timed_out')"


# The dashboard's reads of a long-lived team, each bounded by what it shows or served
# from an index alone (checked with EXPLAIN in tests/stores/test_query_plans.py):
# each member's count of sessions (sessions_member, no row read), one member's latest
# sessions newest first (sessions_member, backwards), the latest closed links newest
# first (links_team, backwards) and how many closed links there are.
SESSION_COUNTS = "SELECT member, count(*) FROM sessions WHERE team = ? GROUP BY member"
LATEST_SESSIONS = (
    " FROM sessions WHERE team = ? AND member = ? ORDER BY created_at DESC, session_id DESC LIMIT ?"
)
LATEST_CLOSED_LINKS = (
    " FROM links WHERE team = ? AND state != 'open' ORDER BY created_at DESC, link_id DESC LIMIT ?"
)
# both counts from an index alone (links_team, links_team_open): no link row is read
CLOSED_LINKS_COUNT = (
    "SELECT (SELECT count(*) FROM links WHERE team = ?)"
    " - (SELECT count(*) FROM links WHERE team = ? AND state = 'open')"
)


def delegations_by_state_query(
    cols: str,
    team: str,
    member: str | None,
    pending: bool,
    limit: int | None,
    *,
    parenthesized: bool = False,
) -> tuple[str, list[Any]]:
    """:meth:`Tx.delegations_by_state`: the team's pending delegations oldest first
    (``member`` is left to the caller: they are few, and read from ``delegations_state``
    alone, where a member's indexes hold every delegation it ever made), or the finished
    ones newest first, from ``delegations_team`` (a member's from ``delegations_caller``
    and ``delegations_callee``) backwards, passing over the few pending ones; bounded by
    what they are, never by every delegation the team keeps."""
    base = f"SELECT {cols} FROM delegations WHERE team = ?"
    page = " LIMIT ?" if limit is not None else ""
    most: list[Any] = [limit] if limit is not None else []
    if pending:
        if member is not None:  # filtered, then limited, by the caller
            page, most = "", []
        return f"{base} AND state = 'pending' ORDER BY created_at, delegation_id{page}", [
            team,
            *most,
        ]
    order = " ORDER BY created_at DESC, delegation_id DESC"
    if member is None:
        return f"{base} AND state != 'pending'{order}{page}", [team, *most]
    one = f"{base} AND caller = ? AND state != 'pending'"
    other = f"{base} AND callee = ? AND caller != ? AND state != 'pending'"
    if parenthesized and limit is not None:
        return (
            f"({one}{order}{page}) UNION ALL ({other}{order}{page}){order}{page}",
            [team, member, *most, team, member, member, *most, *most],
        )
    return f"{one} UNION ALL {other}{order}{page}", [team, member, team, member, member, *most]


def delegation_counts_query(team: str, member: str | None) -> tuple[str, list[Any]]:
    """:meth:`Tx.count_delegations` (read with :func:`delegation_counts`). The team's are
    ``(state, count)`` rows counted from ``delegations_state`` alone, no delegation read;
    a member's, one row for each side of how many it has in each state (in the order of
    :class:`DelegationState`), from its own two indexes: its delegations' rows, summed as
    they are read, with no sort."""
    sql = "FROM delegations WHERE team = ?"
    if member is None:
        return f"SELECT state, count(*) {sql} GROUP BY state", [team]
    sums = ", ".join(
        f"sum(CASE WHEN state = '{state.value}' THEN 1 ELSE 0 END)" for state in DelegationState
    )
    return (
        f"SELECT {sums} {sql} AND caller = ? UNION ALL SELECT {sums} {sql} AND callee = ?"
        " AND caller != ?",
        [team, member, team, member, member],
    )


def delegation_counts(rows: Iterable[Sequence[Any]], member: str | None) -> dict[str, int]:
    """What :func:`delegation_counts_query` read, as each state that has any and its count."""
    counts: dict[str, int] = {}
    for row in rows:
        pairs = (
            [row] if member is None else zip([s.value for s in DelegationState], row, strict=True)
        )
        for state, n in pairs:
            if n:
                counts[state] = counts.get(state, 0) + int(n)
    return counts


def pg(sql: str) -> str:
    """A statement written here (``?`` placeholders) in PostgreSQL's ``%s`` style. The
    statements here hold no literal ``?`` or ``%``."""
    return sql.replace("?", "%s")


def sessions_query(
    cols: str,
    team: str,
    member: str | None,
    which: SessionFilter,
    limit: int | None,
    after: tuple[float, str] | None = None,
) -> tuple[str, list[Any]]:
    """:meth:`Tx.list_sessions`: only the filters in use are named (an ``(? IS NULL OR
    member = ?)`` form would keep PostgreSQL's generic plans off the member indexes).
    ``after`` is a row-value bound, which both databases search in the index that gives
    the order (``sessions_team`` for the team, ``sessions_member`` for one member)."""
    sql = f"SELECT {cols} FROM sessions WHERE team = ?"
    args: list[Any] = [team]
    if member is not None:
        sql += " AND member = ?"
        args.append(member)
    if after is not None:
        sql += " AND (created_at, session_id) > (?, ?)"
        args.extend(after)
    sql += SESSION_FILTER[which] + " ORDER BY created_at, session_id"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return sql, args


def links_query(
    cols: str,
    team: str,
    member: str | None,
    open_only: bool,
    after: tuple[float, str] | None = None,
    limit: int | None = None,
    *,
    parenthesized: bool = False,
) -> tuple[str, tuple[Any, ...]]:
    """:meth:`Tx.list_links`: a member's links are one indexed search per side (an ``OR``
    of the two would read every open link of the team), merged in the order both indexes
    give (``links_initiator``/``links_responder``, or their open-only twins), so a page
    stops after ``limit`` without sorting the member's links; the team's are read from
    ``links_team`` (``links_team_open``). ``after`` is a row-value bound, as for
    sessions."""
    sql = f"SELECT {cols} FROM links WHERE team = ?"
    state = " AND state = 'open'" if open_only else ""
    start = " AND (created_at, link_id) > (?, ?)" if after is not None else ""
    bound: tuple[Any, ...] = tuple(after) if after is not None else ()
    page = " LIMIT ?" if limit is not None else ""
    most: tuple[Any, ...] = (limit,) if limit is not None else ()
    if member is None:
        return sql + state + start + " ORDER BY created_at, link_id" + page, (
            team,
            *bound,
            *most,
        )
    mine = f"{sql} AND initiator = ?{state}{start}"
    theirs = f"{sql} AND responder = ? AND initiator != ?{state}{start}"
    order = " ORDER BY created_at, link_id"
    if parenthesized and limit is not None:
        # PostgreSQL merges the two index scans in order (a Merge Append) only when each
        # side is ordered and limited itself; a bare UNION ALL is appended, then sorted
        return (
            f"({mine}{order}{page}) UNION ALL ({theirs}{order}{page}){order}{page}",
            (team, member, *bound, *most, team, member, member, *bound, *most, *most),
        )
    # SQLite merges a bare UNION ALL in order (and takes no parentheses around its sides)
    return f"{mine} UNION ALL {theirs}{order}{page}", (
        team,
        member,
        *bound,
        team,
        member,
        member,
        *bound,
        *most,
    )


def jobs_query(
    cols: str,
    job_id: str,
    team: str,
    session_id: str | None,
    kind: str | None,
    pending_only: bool,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[str, list[Any]]:
    """:meth:`Tx.list_jobs`: only the filters in use are named (``job_id`` is the
    dialect's name for the id column)."""
    sql = f"SELECT {cols} FROM jobs WHERE team = ?"
    args: list[Any] = [team]
    if session_id is not None:
        sql += " AND session_id = ?"
        args.append(session_id)
    if kind is not None:
        sql += " AND kind = ?"
        args.append(kind)
    if pending_only:
        sql += " AND state = 'pending'"
    sql += f" ORDER BY due_at, {job_id}"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    if offset:
        if limit is None:
            raise ValueError("list_jobs: an offset needs a limit")
        sql += " OFFSET ?"
        args.append(offset)
    return sql, args


def timers_query(
    cols: str,
    job_id: str,
    member_of: str,
    team: str,
    member: str | None,
    session_id: str | None,
    pending_only: bool,
    after: int,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """:meth:`Tx.list_timers`, a page in id order from ``after``: each filter matches
    an index in id order: those of schema 22 (``jobs_timers``, ``jobs_timers_pending``,
    ``jobs_timers_member``), whose WHERE names the kind ``'timer'`` word for word so
    SQLite's planner can use them; a session's from SQLite's ``jobs_team`` (its
    entries end in the id) and PostgreSQL's ``jobs_timers_session``. ``member_of`` is the
    dialect's expression for the member a timer's payload names."""
    sql = f"SELECT {cols} FROM jobs WHERE team = ? AND kind = 'timer'"
    args: list[Any] = [team]
    if pending_only:
        sql += " AND state = 'pending'"
    if member is not None:
        sql += f" AND {member_of} = ?"
        args.append(member)
    if session_id is not None:
        sql += " AND session_id = ?"
        args.append(session_id)
    sql += f" AND {job_id} > ? ORDER BY {job_id}"
    args.append(after)
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return sql, args


def members_query(
    cols: str, team: str, after: str | None, limit: int | None
) -> tuple[str, list[Any]]:
    """:meth:`Tx.list_members`, a page: read from the primary key ``(team, name)`` in
    its order, from the name ``after``."""
    sql = f"SELECT {cols} FROM members WHERE team = ?"
    args: list[Any] = [team]
    if after is not None:
        sql += " AND name > ?"
        args.append(after)
    sql += " ORDER BY name"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return sql, args


def teams_query(cols: str, after: str | None, limit: int | None) -> tuple[str, list[Any]]:
    """:meth:`Tx.list_teams`, a page: read from the primary key ``name`` in its order,
    from the name ``after``."""
    sql = f"SELECT {cols} FROM teams"
    args: list[Any] = []
    if after is not None:
        sql += " WHERE name > ?"
        args.append(after)
    sql += " ORDER BY name"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return sql, args


def budgets_query(
    cols: str, team: str, after: str | None, limit: int | None, hidden: str | None
) -> tuple[str, list[Any]]:
    """:meth:`Tx.list_budgets`, a page: read from the primary key ``(team, key)`` in its
    order, from the key ``after``, leaving out the keys that start with ``hidden`` (one
    range of that key, skipped in the index)."""
    sql = f"SELECT {cols} FROM budgets WHERE team = ?"
    args: list[Any] = [team]
    if after is not None:
        sql += " AND key > ?"
        args.append(after)
    if hidden:
        sql += " AND (key < ? OR key >= ?)"
        args += [hidden, hidden[:-1] + chr(ord(hidden[-1]) + 1)]
    sql += " ORDER BY key"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return sql, args


#: :class:`~backchannel.stores.base.BudgetNeed` as a condition on a budget record; the
#: scopes are told by the key's prefix through ``substr`` so that no plan serves them from
#: the primary key (whose order is not the one shown)
_NEEDS_HUMAN = (
    "((substr(key, 1, 6) = ? AND (used >= ? + granted OR granted > 0))"
    " OR (substr(key, 1, 5) = ? AND window_start > ? AND (used >= ? + granted OR granted > 0)))"
)


def budgets_for_human_query(
    cols: str, team: str, need: Any, offset: int, limit: int | None, *, count: bool = False
) -> tuple[str, list[Any]]:
    """:meth:`Tx.budgets_for_human` (or, ``count``, :meth:`Tx.count_budgets_for_human`):
    read from ``budgets_recent`` backwards, the condition checked on its entries, so only
    the rows of the page are read (the count reads index entries alone)."""
    args: list[Any] = [team, "chain:", need.chain_budget, "pair:", need.window_from]
    args.append(need.pair_budget)
    where = f"FROM budgets WHERE team = ? AND {_NEEDS_HUMAN}"
    if count:
        return f"SELECT count(*) {where}", args
    sql = f"SELECT {cols} {where} ORDER BY updated_at DESC, key DESC"
    if limit is None and not offset:
        return sql, args
    return f"{sql} LIMIT ? OFFSET ?", [*args, 2**62 if limit is None else limit, offset]


def delegations_query(
    cols: str,
    team: str,
    batch: str | None,
    member: str | None,
    peer: str | None = None,
    after: tuple[float, str] | None = None,
    limit: int | None = None,
    *,
    pending_only: bool = False,
    parenthesized: bool = False,
) -> tuple[str, list[Any]]:
    """:meth:`Tx.list_delegations`: only the filters in use are named (the team's
    pending ones are read from ``delegations_state``). A member's are
    one indexed search per side (``delegations_caller``, ``delegations_callee``: an
    ``OR`` of the two would read every delegation of the team), merged in the order both
    give, as for links; the team's page is read from ``delegations_team``. ``after`` is
    a row-value bound, as for sessions."""
    sql = f"SELECT {cols} FROM delegations WHERE team = ?"
    args: list[Any] = [team]
    if batch is not None:
        sql += " AND batch = ?"
        args.append(batch)
    if pending_only:
        sql += " AND state = 'pending'"
    start = " AND (created_at, delegation_id) > (?, ?)" if after is not None else ""
    bound: list[Any] = list(after) if after is not None else []
    order = " ORDER BY created_at, delegation_id"
    page = " LIMIT ?" if limit is not None else ""
    most: list[Any] = [limit] if limit is not None else []
    if member is None:
        return sql + start + order + page, args + bound + most
    mine = f"{sql} AND caller = ?"
    theirs = f"{sql} AND callee = ? AND caller != ?"
    mine_args = [*args, member]
    theirs_args = [*args, member, member]
    if peer is not None:
        mine += " AND callee = ?"
        theirs += " AND caller = ?"
        mine_args.append(peer)
        theirs_args.append(peer)
    mine += start
    theirs += start
    if parenthesized and limit is not None:
        # PostgreSQL merges the two ordered index scans (a Merge Append) only when each
        # side is ordered and limited itself
        return (
            f"({mine}{order}{page}) UNION ALL ({theirs}{order}{page}){order}{page}",
            [*mine_args, *bound, *most, *theirs_args, *bound, *most, *most],
        )
    return f"{mine} UNION ALL {theirs}{order}{page}", [
        *mine_args,
        *bound,
        *theirs_args,
        *bound,
        *most,
    ]
