"""The inbox read cursor's activity query, shared by SQLite and PostgreSQL (``?`` style;
:class:`~backchannel.stores.sql.statements.Sql` holds it in each store's placeholders)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from backchannel.types import MemberActivity

__all__ = ["INBOX_ACTIVITY_SQL", "activity_rows"]

#: Per sender: its latest entry (at, kind, terminates) and its latest approved shutdown.
#: Parameters: team, team. Ties on ``at`` give several rows; :func:`activity_rows` keeps one.
INBOX_ACTIVITY_SQL = """
SELECT e.sender, e.at, e.kind, e.terminates, t.term
FROM (
    SELECT sender, MAX(at) AS at, MAX(CASE WHEN terminates THEN at END) AS term
    FROM inbox_entries
    WHERE team = ? AND kind NOT IN ('hub', 'skipped')
    GROUP BY sender
) t
JOIN inbox_entries e
  ON e.team = ? AND e.sender = t.sender AND e.at = t.at AND e.kind NOT IN ('hub', 'skipped')
ORDER BY e.sender
"""


def activity_rows(team: str, rows: Iterable[Sequence[Any]]) -> list[MemberActivity]:
    """:data:`INBOX_ACTIVITY_SQL` rows as values; on a tie the approved shutdown wins."""
    found: dict[str, MemberActivity] = {}
    for sender, at, kind, terminates, term in rows:
        if sender in found and not terminates:
            continue
        found[sender] = MemberActivity(team, sender, float(at), kind, term)
    return [found[k] for k in sorted(found)]
