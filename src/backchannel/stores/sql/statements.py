"""The statements SQLite and PostgreSQL share, written once with ``?`` placeholders.

Each store builds one :class:`Sql` at import with its placeholder style (SQLite keeps
``?``; PostgreSQL passes :func:`backchannel.stores.sql.pg`) and the names its schema
gives the ids, so no statement is assembled on a hot path. What a dialect adds to a
shared statement (PostgreSQL's ``ON CONFLICT DO NOTHING RETURNING 1`` on an insert that
must report a duplicate) is appended there, also once.
"""

from __future__ import annotations

from collections.abc import Callable

from backchannel.stores.sql import OPEN_DELEGATION
from backchannel.stores.sql.inbox import INBOX_ACTIVITY_SQL
from backchannel.stores.sql.rows import (
    A2A_CLAIM_COLS,
    A2A_COLS,
    BUDGET_COLS,
    DEL_COLS,
    DELIVERY_COLS,
    LEDGER_COLS,
    LINK_COLS,
    MEMBER_COLS,
    MSG_COLS,
    SESSION_COLS,
    TEAM_COLS,
    event_cols,
    job_cols,
)

__all__ = ["Sql"]


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _upsert(table: str, cols: str, key: int) -> str:
    """Insert a row, or overwrite every column but the first ``key`` (the primary key)."""
    names = cols.split(", ")
    sets = ", ".join(f"{c} = excluded.{c}" for c in names[key:])
    keys = ", ".join(names[:key])
    return (
        f"INSERT INTO {table} ({cols}) VALUES ({_marks(len(names))}) "
        f"ON CONFLICT ({keys}) DO UPDATE SET {sets}"
    )


class Sql:
    """The shared statements in one dialect: ``mark`` rewrites the placeholders, ``job_id``
    and ``event_id`` name the id columns of ``jobs`` and ``session_events``."""

    def __init__(self, mark: Callable[[str], str], *, job_id: str, event_id: str) -> None:
        m = mark
        self.job_cols = job_cols(job_id)
        self.event_cols = event_cols(event_id)
        # -- teams and members
        self.get_team = m(f"SELECT {TEAM_COLS} FROM teams WHERE name = ?")
        self.insert_team = m(f"INSERT INTO teams ({TEAM_COLS}) VALUES (?, ?, ?)")
        self.get_member = m(f"SELECT {MEMBER_COLS} FROM members WHERE team = ? AND name = ?")
        self.member_by_token_hash = m(f"SELECT {MEMBER_COLS} FROM members WHERE token_hash = ?")
        self.insert_member = m(f"INSERT INTO members ({MEMBER_COLS}) VALUES ({_marks(7)})")
        self.update_member = m(
            "UPDATE members SET delivery = ?, settings = ? WHERE team = ? AND name = ?"
        )
        self.list_members = m(f"SELECT {MEMBER_COLS} FROM members WHERE team = ? ORDER BY name")
        # -- sessions
        self.get_session = m(
            f"SELECT {SESSION_COLS} FROM sessions WHERE team = ? AND session_id = ?"
        )
        self.put_session = m(_upsert("sessions", SESSION_COLS, 2))
        # -- messages and their deliveries
        self.get_message = m(
            f"SELECT {MSG_COLS} FROM messages m WHERE m.team = ? AND m.message_id = ?"
        )
        self.next_lease_expiry = m("SELECT min(lease_until) FROM deliveries WHERE state = 'leased'")
        self.deliveries = m(
            f"SELECT {DELIVERY_COLS} FROM deliveries WHERE team = ? AND message_id = ? "
            "ORDER BY member"
        )
        self.history = m(
            "SELECT message_id, member, at, event, detail FROM delivery_events "
            "WHERE team = ? AND message_id = ? ORDER BY id"
        )
        self.feed = m(
            "SELECT id, message_id, member, at, event, detail FROM delivery_events "
            "WHERE team = ? AND id > ? ORDER BY id LIMIT ?"
        )
        # the index on (team, id) read backwards: the team's latest events, no more
        self.feed_start = m(
            "SELECT id FROM delivery_events WHERE team = ? ORDER BY id DESC LIMIT 1 OFFSET ?"
        )
        # deliveries_dead, a partial index of the dead copies alone
        self.dead_letters = m(
            f"SELECT {DELIVERY_COLS} FROM deliveries WHERE team = ? AND state = 'dead' "
            "ORDER BY updated_at DESC, seq DESC LIMIT ?"
        )
        self.dead_count = m("SELECT count(*) FROM deliveries WHERE team = ? AND state = 'dead'")
        self.pending_count = m(
            "SELECT count(*) FROM deliveries WHERE team = ? AND member = ? "
            "AND state IN ('queued', 'leased')"
        )
        # deliveries_open, a partial index of the pending copies alone, in member order
        self.pending_counts = m(
            "SELECT member, count(*) FROM deliveries WHERE team = ? "
            "AND state IN ('queued', 'leased') GROUP BY member"
        )
        # jobs_kind_pending, an index of the pending jobs alone: no job row is read
        self.count_pending_jobs = m(
            "SELECT count(*) FROM jobs WHERE team = ? AND kind = ? AND state = 'pending'"
        )
        # -- push delivery ownership
        self.claim_dispatch = m(
            "INSERT INTO dispatch_owners (team, member, owner, lease_until) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (team, member) DO UPDATE SET owner = excluded.owner, "
            "lease_until = excluded.lease_until "
            "WHERE dispatch_owners.owner = excluded.owner OR dispatch_owners.lease_until <= ?"
        )
        self.release_dispatch = m(
            "DELETE FROM dispatch_owners WHERE team = ? AND member = ? AND owner = ?"
        )
        self.dispatch_owner = m(
            "SELECT owner, lease_until FROM dispatch_owners WHERE team = ? AND member = ?"
        )
        # -- push circuits (backchannel.delivery.circuit)
        self.push_circuit = m("SELECT state FROM push_circuits WHERE team = ? AND member = ?")
        self.push_circuits = m(
            "SELECT team, member, state FROM push_circuits ORDER BY team, member"
        )
        self.set_push_circuit = m(
            "INSERT INTO push_circuits (team, member, state) VALUES (?, ?, ?) "
            "ON CONFLICT (team, member) DO UPDATE SET state = excluded.state"
        )
        self.forget_push_circuit = m("DELETE FROM push_circuits WHERE team = ? AND member = ?")
        # -- transcripts and the per-turn ledger
        self.list_events = m(
            f"SELECT {self.event_cols} FROM session_events WHERE team = ? AND session_id = ? "
            f"AND {event_id} > ? AND {event_id} <= ? ORDER BY {event_id} LIMIT ?"
        )
        self.ledger_add = m(f"INSERT INTO ledger ({LEDGER_COLS}) VALUES ({_marks(6)})")
        self.ledger = m(
            f"SELECT {LEDGER_COLS} FROM ledger WHERE team = ? AND session_id = ? ORDER BY id"
        )
        self.ledger_clear = m("DELETE FROM ledger WHERE team = ? AND session_id = ?")
        # -- links
        self.insert_link = m(f"INSERT INTO links ({LINK_COLS}, pair) VALUES ({_marks(14)})")
        self.get_link = m(f"SELECT {LINK_COLS} FROM links WHERE team = ? AND link_id = ?")
        self.find_open_link = m(
            f"SELECT {LINK_COLS} FROM links WHERE team = ? AND pair = ? AND state = 'open'"
        )
        self.update_link = m(
            "UPDATE links SET initiator = ?, initiator_session = ?, responder = ?, "
            "responder_session = ?, budget = ?, created_at = ?, state = ?, turns_used = ?, "
            "closed_at = ?, close_reason = ?, history = ? WHERE team = ? AND link_id = ?"
        )
        # -- scheduled jobs
        self.add_job = m(
            "INSERT INTO jobs (team, kind, due_at, created_at, session_id, payload, state, "
            "watch) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)"
        )
        self.watching = m(
            f"SELECT {self.job_cols} FROM jobs WHERE team = ? AND watch = ? "
            f"AND state = 'pending' ORDER BY {job_id}"
        )
        self.end_watch = m(
            f"UPDATE jobs SET watch = NULL, payload = ? WHERE {job_id} = ? "
            "AND state = 'pending' AND watch IS NOT NULL"
        )
        self.get_job = m(f"SELECT {self.job_cols} FROM jobs WHERE team = ? AND {job_id} = ?")
        self.finish_job = m(
            f"UPDATE jobs SET state = ?, done_at = ? WHERE {job_id} = ? AND state = 'pending'"
        )
        self.reschedule_job = m(
            f"UPDATE jobs SET due_at = ?, payload = ? WHERE {job_id} = ? AND state = 'pending'"
        )
        # -- delegations and one-time tokens
        self.insert_delegation = m(f"INSERT INTO delegations ({DEL_COLS}) VALUES ({_marks(18)})")
        self.get_delegation = m(
            f"SELECT {DEL_COLS} FROM delegations WHERE team = ? AND delegation_id = ?"
        )
        self.delegation_of_call = m(
            f"SELECT {DEL_COLS} FROM delegations WHERE team = ? AND caller_session = ? "
            "AND tool_use_id = ?"
        )
        # a callee session's oldest delegation still waiting for its answer, else its
        # oldest: two indexed searches, however many the session has answered
        callee = f"SELECT {DEL_COLS} FROM delegations WHERE team = ? AND callee_session = ?"
        order = " ORDER BY created_at, delegation_id LIMIT 1"
        self.open_delegation_of_callee = m(f"{callee} AND {OPEN_DELEGATION}{order}")
        self.delegation_of_callee = m(callee + order)
        self.update_delegation = m(
            "UPDATE delegations SET state = ?, result = ?, error = ?, answered_at = ?, "
            "callee_session = ?, created_at = ?, deadline = ? "
            "WHERE team = ? AND delegation_id = ?"
        )
        self.prune_delegations = m(
            "DELETE FROM delegations WHERE team = ? AND COALESCE(answered_at, deadline) < ? "
            "AND deadline < ? AND batch NOT IN "
            "(SELECT batch FROM delegations WHERE team = ? AND state = 'pending')"
        )
        self.spend_token = m(
            "INSERT INTO spent_tokens (jti, expires_at) VALUES (?, ?) ON CONFLICT DO NOTHING"
        )
        self.prune_spent_tokens = m("DELETE FROM spent_tokens WHERE expires_at <= ?")
        # -- inbox files read back
        self.inbox_record = m(
            "INSERT INTO inbox_entries (team, inbox, entry_id, sender, kind, at, seen_at, "
            "terminates) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
        )
        self.inbox_activity = m(INBOX_ACTIVITY_SQL)
        self.inbox_seen_before = m(
            "SELECT entry_id FROM inbox_entries WHERE team = ? AND inbox = ? AND seen_at < ?"
        )
        # -- conversation budgets and A2A tasks
        self.get_budget = m(f"SELECT {BUDGET_COLS} FROM budgets WHERE team = ? AND key = ?")
        self.put_budget = m(_upsert("budgets", BUDGET_COLS, 2))
        self.put_a2a_task = m(
            f"INSERT INTO a2a_tasks ({A2A_COLS}) VALUES ({_marks(9)}) "
            "ON CONFLICT (team, task_id) DO UPDATE SET member = excluded.member, "
            "owner = excluded.owner, context_id = excluded.context_id, state = excluded.state, "
            "body = excluded.body, updated_at = excluded.updated_at"
        )
        self.get_a2a_task = m(f"SELECT {A2A_COLS} FROM a2a_tasks WHERE team = ? AND task_id = ?")
        self.list_a2a_tasks = m(
            f"SELECT {A2A_COLS} FROM a2a_tasks WHERE team = ? AND member = ? AND owner = ? "
            "ORDER BY updated_at DESC, task_id"
        )
        self.claim_a2a_message = m(
            f"INSERT INTO a2a_claims ({A2A_CLAIM_COLS}) VALUES ({_marks(5)}) "
            "ON CONFLICT (team, message_id) DO NOTHING"
        )
        self.get_a2a_claim = m(
            f"SELECT {A2A_CLAIM_COLS} FROM a2a_claims WHERE team = ? AND message_id = ?"
        )
