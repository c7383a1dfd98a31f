"""The SQLite schema as numbered migrations, and how they are applied.

Migration ``n`` takes a file from version ``n - 1`` to ``n``; a released migration is
never edited, only followed by a new one. Each is applied under the write lock
(``BEGIN IMMEDIATE``) and recorded in ``schema_migrations``; a file written by newer code
is refused.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from backchannel.errors import StoreError
from backchannel.stores.base import SCHEMA_VERSION

__all__ = ["MIGRATIONS", "migrate"]

# a pending job's first message from the member it watches (migration 11)
_FIRST_REPLY = """(
    SELECT m.message_id FROM messages m JOIN deliveries d
        ON d.team = m.team AND d.message_id = m.message_id
        AND d.member = json_extract(jobs.payload, '$.member')
    WHERE m.team = jobs.team AND m.sender = jobs.watch
        AND m.created_at >= COALESCE(json_extract(jobs.payload, '$.set_at'), jobs.created_at)
    ORDER BY m.created_at LIMIT 1
)"""

MIGRATIONS: list[str] = [
    # 1: the messaging core
    """
    CREATE TABLE teams (
        name TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        settings TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE members (
        team TEXT NOT NULL,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        created_at REAL NOT NULL,
        token_hash TEXT NOT NULL UNIQUE,
        delivery TEXT NOT NULL DEFAULT '{}',
        settings TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, name)
    );
    CREATE TABLE sessions (
        team TEXT NOT NULL,
        session_id TEXT NOT NULL,
        member TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        turn INTEGER NOT NULL DEFAULT 0,
        turn_started_at REAL,
        turn_kind TEXT NOT NULL DEFAULT 'normal',
        last_output TEXT NOT NULL DEFAULT '',
        last_stop_at REAL,
        meta TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, session_id)
    );
    CREATE INDEX sessions_member ON sessions (team, member, created_at);
    CREATE TABLE messages (
        team TEXT NOT NULL,
        message_id TEXT NOT NULL,
        sender TEXT NOT NULL,
        sender_session TEXT,
        to_name TEXT NOT NULL,
        kind TEXT NOT NULL,
        text TEXT NOT NULL,
        summary TEXT,
        created_at REAL NOT NULL,
        fingerprint TEXT NOT NULL,
        meta TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, message_id)
    );
    CREATE TABLE deliveries (
        seq INTEGER PRIMARY KEY,
        team TEXT NOT NULL,
        message_id TEXT NOT NULL,
        member TEXT NOT NULL,
        session TEXT,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        lease_until REAL,
        dead_reason TEXT,
        UNIQUE (team, message_id, member)
    );
    CREATE INDEX deliveries_queued ON deliveries (team, member, seq) WHERE state = 'queued';
    CREATE INDEX deliveries_leased ON deliveries (lease_until) WHERE state = 'leased';
    CREATE TABLE delivery_events (
        id INTEGER PRIMARY KEY,
        team TEXT NOT NULL,
        message_id TEXT NOT NULL,
        member TEXT NOT NULL,
        at REAL NOT NULL,
        event TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX delivery_events_message ON delivery_events (team, message_id, id);
    CREATE INDEX delivery_events_team ON delivery_events (team, id);
    """,
    # 2: transcripts, the per-turn ledger, scheduled jobs
    """
    CREATE TABLE session_events (
        id INTEGER PRIMARY KEY,
        team TEXT NOT NULL,
        session_id TEXT NOT NULL,
        turn INTEGER NOT NULL,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        text TEXT NOT NULL DEFAULT '',
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX session_events_session ON session_events (team, session_id, id);
    CREATE TABLE ledger (
        id INTEGER PRIMARY KEY,
        team TEXT NOT NULL,
        session_id TEXT NOT NULL,
        to_name TEXT NOT NULL,
        digest TEXT NOT NULL,
        message_id TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX ledger_session ON ledger (team, session_id, id);
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY,
        team TEXT NOT NULL,
        kind TEXT NOT NULL,
        due_at REAL NOT NULL,
        created_at REAL NOT NULL,
        session_id TEXT,
        payload TEXT NOT NULL DEFAULT '{}',
        state TEXT NOT NULL DEFAULT 'pending',
        done_at REAL
    );
    CREATE INDEX jobs_due ON jobs (due_at, id) WHERE state = 'pending';
    CREATE INDEX jobs_team ON jobs (team, session_id, kind);
    """,
    # 3: links
    """
    CREATE TABLE links (
        team TEXT NOT NULL,
        link_id TEXT NOT NULL,
        pair TEXT NOT NULL,
        initiator TEXT NOT NULL,
        initiator_session TEXT NOT NULL,
        responder TEXT NOT NULL,
        responder_session TEXT,
        budget INTEGER NOT NULL,
        turns_used INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        closed_at REAL,
        close_reason TEXT,
        history TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (team, link_id)
    );
    CREATE UNIQUE INDEX links_open_pair ON links (team, pair) WHERE state = 'open';
    CREATE INDEX links_initiator ON links (team, initiator);
    CREATE INDEX links_responder ON links (team, responder);
    """,
    # 4: "has the peer replied since?" for wait timers
    """
    CREATE INDEX messages_sender ON messages (team, sender, created_at);
    """,
    # 5: delegation and one-time tokens
    """
    CREATE TABLE delegations (
        team TEXT NOT NULL,
        delegation_id TEXT NOT NULL,
        route TEXT NOT NULL,
        caller TEXT NOT NULL,
        caller_session TEXT NOT NULL,
        tool_use_id TEXT NOT NULL,
        callee TEXT NOT NULL,
        task TEXT NOT NULL,
        created_at REAL NOT NULL,
        deadline REAL NOT NULL,
        batch TEXT NOT NULL,
        callee_session TEXT,
        state TEXT NOT NULL,
        result TEXT,
        error TEXT,
        answered_at REAL,
        reply_service TEXT,
        reply_token TEXT,
        PRIMARY KEY (team, delegation_id),
        UNIQUE (team, caller_session, tool_use_id)
    );
    CREATE INDEX delegations_callee_session ON delegations (team, callee_session);
    CREATE INDEX delegations_batch ON delegations (team, batch);
    CREATE TABLE spent_tokens (
        jti TEXT PRIMARY KEY,
        expires_at REAL NOT NULL
    );
    """,
    # 6: indexes that keep the hot paths flat as messages, sessions, links and jobs pile up
    """
    DROP INDEX sessions_member;
    CREATE INDEX sessions_member ON sessions (team, member, created_at, session_id);
    CREATE INDEX sessions_live ON sessions (team, member, created_at, session_id)
        WHERE state != 'terminated';
    CREATE INDEX sessions_active ON sessions (team, member, created_at, session_id)
        WHERE state = 'active';
    CREATE INDEX links_open_initiator ON links (team, initiator, created_at, link_id)
        WHERE state = 'open';
    CREATE INDEX links_open_responder ON links (team, responder, created_at, link_id)
        WHERE state = 'open';
    CREATE INDEX jobs_session_pending ON jobs (team, session_id, kind, due_at, id)
        WHERE state = 'pending';
    CREATE INDEX spent_tokens_expiry ON spent_tokens (expires_at);
    CREATE INDEX deliveries_open ON deliveries (team, member)
        WHERE state IN ('queued', 'leased');
    CREATE INDEX messages_created ON messages (created_at);
    CREATE INDEX jobs_kind_pending ON jobs (team, kind, due_at, id) WHERE state = 'pending';
    DROP INDEX delegations_callee_session;
    CREATE INDEX delegations_callee_session
        ON delegations (team, callee_session, created_at, delegation_id);
    CREATE INDEX delegations_callee_open
        ON delegations (team, callee_session, created_at, delegation_id)
        WHERE state IN ('pending', 'timed_out');
    CREATE INDEX jobs_finished ON jobs (done_at) WHERE state != 'pending';
    """,
    # 7: the read cursor of Claude Code inbox files
    """
    CREATE TABLE inbox_entries (
        team TEXT NOT NULL,
        inbox TEXT NOT NULL,
        entry_id TEXT NOT NULL,
        sender TEXT NOT NULL,
        kind TEXT NOT NULL,
        at REAL NOT NULL,
        seen_at REAL NOT NULL,
        terminates INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (team, inbox, entry_id)
    );
    CREATE INDEX inbox_entries_sender ON inbox_entries (team, sender, at);
    """,
    # 8: conversation budgets: every message's chain and hop; spent budgets
    """
    ALTER TABLE messages ADD COLUMN chain_id TEXT;
    ALTER TABLE messages ADD COLUMN hop INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE budgets (
        team TEXT NOT NULL,
        key TEXT NOT NULL,
        window_start REAL NOT NULL,
        used INTEGER NOT NULL DEFAULT 0,
        granted INTEGER NOT NULL DEFAULT 0,
        last_from TEXT,
        stopped_at REAL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (team, key)
    );
    """,
    # 9: A2A tasks
    """
    CREATE TABLE a2a_tasks (
        team TEXT NOT NULL,
        task_id TEXT NOT NULL,
        member TEXT NOT NULL,
        owner TEXT NOT NULL,
        context_id TEXT NOT NULL,
        state TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (team, task_id)
    );
    CREATE INDEX a2a_tasks_owner ON a2a_tasks (team, member, owner, updated_at);
    """,
    # 10: which hub pushes each member's messages (a lease that moves on failover)
    """
    CREATE TABLE dispatch_owners (
        team TEXT NOT NULL,
        member TEXT NOT NULL,
        owner TEXT NOT NULL,
        lease_until REAL NOT NULL,
        PRIMARY KEY (team, member)
    );
    """,
    # 11: a timer notes its target's first reply as it is sent, so messages need no index
    #     by sender (16 senders wrote 16 places in it every commit); the timers pending
    #     now get their target as their watch, or the reply already sent
    f"""
    ALTER TABLE jobs ADD COLUMN watch TEXT;
    CREATE INDEX jobs_watch ON jobs (team, watch) WHERE state = 'pending' AND watch IS NOT NULL;
    UPDATE jobs SET watch = json_extract(payload, '$.target')
        WHERE kind = 'timer' AND state = 'pending'
        AND json_extract(payload, '$.target') IS NOT NULL;
    UPDATE jobs SET payload = json_set(payload, '$.reply', {_FIRST_REPLY})
        WHERE watch IS NOT NULL AND {_FIRST_REPLY} IS NOT NULL;
    UPDATE jobs SET watch = NULL
        WHERE watch IS NOT NULL AND json_extract(payload, '$.reply') IS NOT NULL;
    DROP INDEX messages_sender;
    """,
    # 12: the dead copies of a team, latest first, for the dashboard's dead letters panel
    """
    CREATE INDEX deliveries_dead ON deliveries (team, state, updated_at, seq)
        WHERE state = 'dead';
    """,
    # 13: retention pages by (created_at, team, message_id), so a pass gets past any
    #     number of messages created at one moment; the index also covers its read
    """
    DROP INDEX messages_created;
    CREATE INDEX messages_created ON messages (created_at, team, message_id);
    """,
    # 14: set_timer made again under its request_id finds its timer by that key, not
    #     among every timer the session set within the retention window
    """
    CREATE INDEX jobs_request
        ON jobs (team, session_id, kind, json_extract(payload, '$.request_id'))
        WHERE json_extract(payload, '$.request_id') IS NOT NULL;
    """,
    # 15: a member's reaction with one emoji is in a message's history once, as the
    #     database enforces; copies an earlier hub recorded (the first is kept) go first
    """
    DELETE FROM delivery_events WHERE event = 'reaction' AND id NOT IN (
        SELECT min(id) FROM delivery_events WHERE event = 'reaction'
        GROUP BY team, message_id, member, detail
    );
    CREATE UNIQUE INDEX delivery_events_reaction
        ON delivery_events (team, message_id, member, detail) WHERE event = 'reaction';
    """,
    # 16: the largest cursor of a team's history events retention removed, so a feed
    #     reader resuming below it is told that it missed events (0: none removed yet)
    """
    ALTER TABLE teams ADD COLUMN feed_removed INTEGER NOT NULL DEFAULT 0;
    """,
    # 17: a member's push circuit while its target is down, so every hub warns its
    #     senders and shows it, and a hub that takes the member over keeps probing
    #     (backchannel.delivery.circuit; written when it opens, is probed, closes)
    """
    CREATE TABLE push_circuits (
        team TEXT NOT NULL,
        member TEXT NOT NULL,
        state TEXT NOT NULL,
        PRIMARY KEY (team, member)
    );
    """,
    # 18: which A2A task a caller's message started, written with the message that
    #     hands it to the member, so the same message sent again to any hub on the
    #     store (or to a hub restarted since) is answered with that one task
    #     (backchannel.interfaces.a2a_tasks, MemberRequestHandler._repeat)
    """
    CREATE TABLE a2a_claims (
        team TEXT NOT NULL,
        message_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        context_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (team, message_id)
    );
    """,
    # 19: a team's sessions in the order they were opened, and its links (a member's
    #     from either side) in the order they opened, so a page of GET /v1/sessions or
    #     GET /v1/links (after the last one of the page before) is an index search, not
    #     a sort of every session or link the team ever had
    """
    CREATE INDEX sessions_team ON sessions (team, created_at, session_id);
    DROP INDEX links_initiator;
    CREATE INDEX links_initiator ON links (team, initiator, created_at, link_id);
    DROP INDEX links_responder;
    CREATE INDEX links_responder ON links (team, responder, created_at, link_id);
    CREATE INDEX links_team ON links (team, created_at, link_id);
    CREATE INDEX links_team_open ON links (team, created_at, link_id) WHERE state = 'open';
    """,
    # 20: a team's delegations in the order they were made, and a member's from either
    #     side, so a page of GET /v1/delegations (after the last one of the page before)
    #     is an index search, not a sort of every delegation the team kept; a turn's
    #     batch is read in that order too (else the planner would take the team's order
    #     over the batch's rows)
    """
    CREATE INDEX delegations_team ON delegations (team, created_at, delegation_id);
    CREATE INDEX delegations_caller ON delegations (team, caller, created_at, delegation_id);
    CREATE INDEX delegations_callee ON delegations (team, callee, created_at, delegation_id);
    DROP INDEX delegations_batch;
    CREATE INDEX delegations_batch ON delegations (team, batch, created_at, delegation_id);
    """,
    # 21: the receive a copy is leased to, when its client named it (``receive_id``):
    #     a receive made again after its answer was lost on the way (a proxy cut it)
    #     finds what the first one leased, by an index of only the leases so named
    """
    ALTER TABLE deliveries ADD COLUMN lease_holder TEXT;
    CREATE INDEX deliveries_holder ON deliveries (team, member, lease_holder, seq)
        WHERE state = 'leased' AND lease_holder IS NOT NULL;
    """,
    # 22: a team's delegations by state, so the dashboard reads the pending ones and
    #     counts each state from an index, never every delegation of the week kept; a
    #     team's live and active sessions in the order they opened, so a team-wide read
    #     of them (GET /v1/sessions?live_only, the MCP server's list_members) never reads
    #     every session the team ever had (each filter is its index's WHERE); and the
    #     timers listed a page at a time in the order they were set (the API's,
    #     list_timers'), the team's, a member's or a session's, read from an index in
    #     that order: never every timer of the team sorted (a team holds up to
    #     max_timers for each member), nor the fired and cancelled ones when only the
    #     pending are asked for the team (a session's come from jobs_team, whose
    #     entries end in the id)
    """
    CREATE INDEX delegations_state ON delegations (team, state, created_at, delegation_id);
    CREATE INDEX sessions_team_live ON sessions (team, created_at, session_id)
        WHERE state != 'terminated';
    CREATE INDEX sessions_team_active ON sessions (team, created_at, session_id)
        WHERE state = 'active';
    CREATE INDEX jobs_timers ON jobs (team, id) WHERE kind = 'timer';
    CREATE INDEX jobs_timers_pending ON jobs (team, id)
        WHERE kind = 'timer' AND state = 'pending';
    CREATE INDEX jobs_timers_member ON jobs (team, json_extract(payload, '$.member'), id)
        WHERE kind = 'timer';
    """,
    # 23: a team's budgets, the most recently updated first, so the dashboard's budgets
    #     panel reads the page it shows and counts the rest from index entries alone
    #     (the columns that say whether a budget needs a human are in the index), never
    #     every spent chain the team ever had
    """
    CREATE INDEX budgets_recent ON budgets (team, updated_at, key, used, granted, window_start);
    """,
    # 24: a member's pending timers alone, for the timer quota counted on every
    #     set_timer: jobs_timers_member holds the fired and cancelled ones too, which a
    #     member that sets a timer a turn piles up by the hundred thousand within the
    #     retention window
    """
    CREATE INDEX jobs_timers_member_pending ON jobs (team, json_extract(payload, '$.member'), id)
        WHERE kind = 'timer' AND state = 'pending';
    """,
    # 25: the store's identity, a random id made once, when the store is made: hubs of
    #     one store know each other by it (the claims of Claude Code inbox files name
    #     it), however each reaches the store
    """
    CREATE TABLE store_identity (
        one INTEGER PRIMARY KEY CHECK (one = 1),
        store_id TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    INSERT INTO store_identity (one, store_id, created_at)
        VALUES (1, lower(hex(randomblob(16))), strftime('%s','now'));
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the file on ``conn`` to :data:`SCHEMA_VERSION` in one write transaction."""
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations "
        "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    current = row[0] or 0
    if current > SCHEMA_VERSION:
        conn.execute("ROLLBACK")
        raise StoreError(
            f"the SQLite file {path} has schema version {current}, newer than "
            f"this backchannel (which knows up to {SCHEMA_VERSION}); upgrade backchannel"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[version - 1].split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?, strftime('%s','now'))",
            (version,),
        )
    conn.execute("COMMIT")
