"""The PostgreSQL schema as numbered migrations, and how they are applied.

The schema mirrors the SQLite one (the row mapping both share is
:mod:`backchannel.stores.sql.rows`). Team-owned tables are keyed by ``team`` first, since
every query about them is scoped to one team, which is also what a sharded deployment
distributes by (docs/postgres.md); ``jobs`` (keyed by a global id) and ``spent_tokens``
are the exceptions. Migration ``n`` takes a database from version ``n - 1`` to ``n``; a
released migration is never edited, only followed by a new one. JSON values are
``jsonb``; times are UNIX seconds in ``double precision``.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from backchannel.errors import StoreError
from backchannel.stores.base import SCHEMA_VERSION
from backchannel.stores.postgres.transaction import CHANNEL

__all__ = ["MIGRATIONS", "SCHEMA_NOTICE", "migrate"]

log = logging.getLogger("backchannel.stores.postgres")
_MIGRATION_LOCK = 0x6263_6D69_6772_6174  # "bcmigrat"
#: How a migration announces the version it reached on the hubs' channel
#: (``schema:16``); no hub's origin is named ``schema``, so no wake-up reads like it.
SCHEMA_NOTICE = "schema:"

MIGRATIONS: list[str] = [
    # 1: the messaging core (mirrors the SQLite schema; every key starts with team)
    """
    CREATE TABLE teams (
        name text PRIMARY KEY,
        created_at double precision NOT NULL,
        settings jsonb NOT NULL DEFAULT '{}'
    );
    CREATE TABLE members (
        team text NOT NULL,
        name text NOT NULL,
        kind text NOT NULL,
        created_at double precision NOT NULL,
        token_hash text NOT NULL UNIQUE,
        delivery jsonb NOT NULL DEFAULT '{}',
        settings jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, name)
    );
    CREATE TABLE sessions (
        team text NOT NULL,
        session_id text NOT NULL,
        member text NOT NULL,
        state text NOT NULL,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        turn integer NOT NULL DEFAULT 0,
        turn_started_at double precision,
        turn_kind text NOT NULL DEFAULT 'normal',
        last_output text NOT NULL DEFAULT '',
        last_stop_at double precision,
        meta jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, session_id)
    );
    CREATE INDEX sessions_member ON sessions (team, member, created_at);
    CREATE TABLE messages (
        team text NOT NULL,
        message_id text NOT NULL,
        sender text NOT NULL,
        sender_session text,
        to_name text NOT NULL,
        kind text NOT NULL,
        text text NOT NULL,
        summary text,
        created_at double precision NOT NULL,
        fingerprint text NOT NULL,
        meta jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, message_id)
    );
    CREATE SEQUENCE delivery_seq;
    CREATE TABLE deliveries (
        team text NOT NULL,
        message_id text NOT NULL,
        member text NOT NULL,
        session text,
        seq bigint NOT NULL,
        state text NOT NULL,
        attempts integer NOT NULL DEFAULT 0,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        lease_until double precision,
        dead_reason text,
        PRIMARY KEY (team, message_id, member)
    );
    CREATE INDEX deliveries_queued ON deliveries (team, member, seq) WHERE state = 'queued';
    CREATE INDEX deliveries_open ON deliveries (team, member) WHERE state IN ('queued', 'leased');
    CREATE INDEX deliveries_leased ON deliveries (lease_until) WHERE state = 'leased';
    CREATE SEQUENCE delivery_event_id;
    CREATE TABLE delivery_events (
        team text NOT NULL,
        id bigint NOT NULL,
        message_id text NOT NULL,
        member text NOT NULL,
        at double precision NOT NULL,
        event text NOT NULL,
        detail text NOT NULL DEFAULT '',
        PRIMARY KEY (team, id)
    );
    CREATE INDEX delivery_events_message ON delivery_events (team, message_id, id);
    """,
    # 2: transcripts, the per-turn ledger, scheduled jobs
    """
    CREATE SEQUENCE session_event_id;
    CREATE TABLE session_events (
        team text NOT NULL,
        event_id bigint NOT NULL,
        session_id text NOT NULL,
        turn integer NOT NULL,
        at double precision NOT NULL,
        kind text NOT NULL,
        text text NOT NULL DEFAULT '',
        data jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, event_id)
    );
    CREATE INDEX session_events_session ON session_events (team, session_id, event_id);
    CREATE TABLE ledger (
        team text NOT NULL,
        id bigserial,
        session_id text NOT NULL,
        to_name text NOT NULL,
        digest text NOT NULL,
        message_id text NOT NULL,
        at double precision NOT NULL,
        PRIMARY KEY (team, id)
    );
    CREATE INDEX ledger_session ON ledger (team, session_id, id);
    CREATE TABLE jobs (
        job_id bigserial PRIMARY KEY,
        team text NOT NULL,
        kind text NOT NULL,
        due_at double precision NOT NULL,
        created_at double precision NOT NULL,
        session_id text,
        payload jsonb NOT NULL DEFAULT '{}',
        state text NOT NULL,
        done_at double precision
    );
    CREATE INDEX jobs_due ON jobs (due_at, job_id) WHERE state = 'pending';
    CREATE INDEX jobs_team ON jobs (team, due_at, job_id);
    """,
    # 3: links
    """
    CREATE TABLE links (
        team text NOT NULL,
        link_id text NOT NULL,
        pair text NOT NULL,
        initiator text NOT NULL,
        initiator_session text NOT NULL,
        responder text NOT NULL,
        responder_session text,
        budget integer NOT NULL,
        turns_used integer NOT NULL DEFAULT 0,
        state text NOT NULL,
        created_at double precision NOT NULL,
        closed_at double precision,
        close_reason text,
        history jsonb NOT NULL DEFAULT '[]',
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
        team text NOT NULL,
        delegation_id text NOT NULL,
        route text NOT NULL,
        caller text NOT NULL,
        caller_session text NOT NULL,
        tool_use_id text NOT NULL,
        callee text NOT NULL,
        task text NOT NULL,
        created_at double precision NOT NULL,
        deadline double precision NOT NULL,
        batch text NOT NULL,
        callee_session text,
        state text NOT NULL,
        result text,
        error text,
        answered_at double precision,
        reply_service text,
        reply_token text,
        PRIMARY KEY (team, delegation_id),
        UNIQUE (team, caller_session, tool_use_id)
    );
    CREATE INDEX delegations_callee_session ON delegations (team, callee_session);
    CREATE INDEX delegations_batch ON delegations (team, batch);
    CREATE TABLE spent_tokens (
        jti text PRIMARY KEY,
        expires_at double precision NOT NULL
    );
    CREATE INDEX spent_tokens_expiry ON spent_tokens (expires_at);
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
    CREATE INDEX jobs_session_pending ON jobs (team, session_id, kind, due_at, job_id)
        WHERE state = 'pending';
    DROP INDEX deliveries_leased;
    CREATE INDEX deliveries_leased ON deliveries (lease_until, seq) WHERE state = 'leased';
    CREATE INDEX messages_created ON messages (created_at);
    CREATE INDEX jobs_kind_pending ON jobs (team, kind, due_at, job_id) WHERE state = 'pending';
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
        team text NOT NULL,
        inbox text NOT NULL,
        entry_id text NOT NULL,
        sender text NOT NULL,
        kind text NOT NULL,
        at double precision NOT NULL,
        seen_at double precision NOT NULL,
        terminates boolean NOT NULL DEFAULT false,
        PRIMARY KEY (team, inbox, entry_id)
    );
    CREATE INDEX inbox_entries_sender ON inbox_entries (team, sender, at);
    """,
    # 8: conversation budgets: every message's chain and hop; spent budgets
    """
    ALTER TABLE messages ADD COLUMN chain_id text;
    ALTER TABLE messages ADD COLUMN hop integer NOT NULL DEFAULT 0;
    CREATE TABLE budgets (
        team text NOT NULL,
        key text NOT NULL,
        window_start double precision NOT NULL,
        used integer NOT NULL DEFAULT 0,
        granted integer NOT NULL DEFAULT 0,
        last_from text,
        stopped_at double precision,
        updated_at double precision NOT NULL,
        PRIMARY KEY (team, key)
    );
    """,
    # 9: A2A tasks
    """
    CREATE TABLE a2a_tasks (
        team text NOT NULL,
        task_id text NOT NULL,
        member text NOT NULL,
        owner text NOT NULL,
        context_id text NOT NULL,
        state text NOT NULL,
        body text NOT NULL,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        PRIMARY KEY (team, task_id)
    );
    CREATE INDEX a2a_tasks_owner ON a2a_tasks (team, member, owner, updated_at);
    """,
    # 10: which hub pushes each member's messages (a lease that moves on failover)
    """
    CREATE TABLE dispatch_owners (
        team text NOT NULL,
        member text NOT NULL,
        owner text NOT NULL,
        lease_until double precision NOT NULL,
        PRIMARY KEY (team, member)
    );
    """,
    # 11: a timer notes its target's first reply as it is sent (see the SQLite schema)
    """
    ALTER TABLE jobs ADD COLUMN watch text;
    CREATE INDEX jobs_watch ON jobs (team, watch, job_id)
        WHERE state = 'pending' AND watch IS NOT NULL;
    UPDATE jobs SET watch = payload->>'target'
        WHERE kind = 'timer' AND state = 'pending' AND payload->>'target' IS NOT NULL;
    WITH replies AS (
        SELECT j.job_id, (
            SELECT m.message_id FROM messages m JOIN deliveries d
                ON d.team = m.team AND d.message_id = m.message_id
                AND d.member = j.payload->>'member'
            WHERE m.team = j.team AND m.sender = j.watch
                AND m.created_at >= COALESCE((j.payload->>'set_at')::double precision, j.created_at)
            ORDER BY m.created_at, d.seq LIMIT 1
        ) AS reply
        FROM jobs j WHERE j.watch IS NOT NULL
    )
    UPDATE jobs SET payload = jsonb_set(jobs.payload, '{reply}', to_jsonb(r.reply)), watch = NULL
        FROM replies r WHERE jobs.job_id = r.job_id AND r.reply IS NOT NULL;
    DROP INDEX messages_sender;
    """,
    # 12: the dead copies of a team, latest first (see the SQLite schema)
    """
    CREATE INDEX deliveries_dead ON deliveries (team, state, updated_at, seq)
        WHERE state = 'dead';
    """,
    # 13: retention pages by (created_at, team, message_id) (see the SQLite schema)
    """
    DROP INDEX messages_created;
    CREATE INDEX messages_created ON messages (created_at, team, message_id);
    """,
    # 14: a job by its request id (see the SQLite schema)
    """
    CREATE INDEX jobs_request ON jobs (team, session_id, kind, (payload->>'request_id'))
        WHERE payload->>'request_id' IS NOT NULL;
    """,
    # 15: a reaction once in a message's history, enforced (see the SQLite schema)
    """
    DELETE FROM delivery_events d USING delivery_events k
        WHERE d.event = 'reaction' AND k.event = 'reaction' AND k.team = d.team
        AND k.message_id = d.message_id AND k.member = d.member AND k.detail = d.detail
        AND k.id < d.id;
    CREATE UNIQUE INDEX delivery_events_reaction
        ON delivery_events (team, message_id, member, detail) WHERE event = 'reaction';
    """,
    # 16: the largest cursor of a team's removed history events (see the SQLite schema)
    """
    ALTER TABLE teams ADD COLUMN feed_removed bigint NOT NULL DEFAULT 0;
    """,
    # 17: a member's push circuit while its target is down (see the SQLite schema)
    """
    CREATE TABLE push_circuits (
        team text NOT NULL,
        member text NOT NULL,
        state text NOT NULL,
        PRIMARY KEY (team, member)
    );
    """,
    # 18: which A2A task a caller's message started (see the SQLite schema)
    """
    CREATE TABLE a2a_claims (
        team text NOT NULL,
        message_id text NOT NULL,
        task_id text NOT NULL,
        context_id text NOT NULL,
        created_at double precision NOT NULL,
        PRIMARY KEY (team, message_id)
    );
    """,
    # 19: a team's sessions and links in the order they were opened, for their pages
    #     (see the SQLite schema)
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
    #     side, for their pages (see the SQLite schema)
    """
    CREATE INDEX delegations_team ON delegations (team, created_at, delegation_id);
    CREATE INDEX delegations_caller ON delegations (team, caller, created_at, delegation_id);
    CREATE INDEX delegations_callee ON delegations (team, callee, created_at, delegation_id);
    DROP INDEX delegations_batch;
    CREATE INDEX delegations_batch ON delegations (team, batch, created_at, delegation_id);
    """,
    # 21: the receive a copy is leased to, when its client named it (see the SQLite
    #     schema)
    """
    ALTER TABLE deliveries ADD COLUMN lease_holder TEXT;
    CREATE INDEX deliveries_holder ON deliveries (team, member, lease_holder, seq)
        WHERE state = 'leased' AND lease_holder IS NOT NULL;
    """,
    # 22: a team's delegations by state, a team's live and active sessions in the order
    #     they opened, and the timers a page at a time in the order they were set (see
    #     the SQLite schema; a session's timers need an index of their own here, as no
    #     index ends in the id)
    """
    CREATE INDEX delegations_state ON delegations (team, state, created_at, delegation_id);
    CREATE INDEX sessions_team_live ON sessions (team, created_at, session_id)
        WHERE state != 'terminated';
    CREATE INDEX sessions_team_active ON sessions (team, created_at, session_id)
        WHERE state = 'active';
    CREATE INDEX jobs_timers ON jobs (team, job_id) WHERE kind = 'timer';
    CREATE INDEX jobs_timers_pending ON jobs (team, job_id)
        WHERE kind = 'timer' AND state = 'pending';
    CREATE INDEX jobs_timers_member ON jobs (team, (payload->>'member'), job_id)
        WHERE kind = 'timer';
    CREATE INDEX jobs_timers_session ON jobs (team, session_id, job_id) WHERE kind = 'timer';
    """,
    # 23: a team's budgets, the most recently updated first (see the SQLite schema)
    """
    CREATE INDEX budgets_recent ON budgets (team, updated_at, key, used, granted, window_start);
    """,
    # 24: a member's pending timers alone, for the timer quota (see the SQLite schema)
    """
    CREATE INDEX jobs_timers_member_pending ON jobs (team, (payload->>'member'), job_id)
        WHERE kind = 'timer' AND state = 'pending';
    """,
    # 25: the store's identity, a random id made once (see the SQLite schema)
    """
    CREATE TABLE store_identity (
        one integer PRIMARY KEY CHECK (one = 1),
        store_id text NOT NULL,
        created_at double precision NOT NULL
    );
    INSERT INTO store_identity (one, store_id, created_at)
        VALUES (1, replace(gen_random_uuid()::text, '-', ''), extract(epoch FROM now()));
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION


def migrate(conn: psycopg.Connection[Any], url: str) -> None:
    """Bring the database to :data:`SCHEMA_VERSION` in one transaction, under an advisory
    lock so that hubs starting together migrate once; ``url`` (masked) names it in errors."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
        current = int(row[0]) if row and row[0] is not None else 0
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"the PostgreSQL database {url} has schema version {current}, but "
                f"this backchannel supports up to version {SCHEMA_VERSION} (it does not "
                f"know migration {current}, applied by a newer backchannel): upgrade "
                f"backchannel on this host to a release that includes migration {current}, "
                "the version the other hubs run (or point it at another database)",
                store=url,
                database_version=current,
                supported_version=SCHEMA_VERSION,
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            log.info("migrating %s to schema version %d", url, version)
            conn.execute(MIGRATIONS[version - 1].encode())
            conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
        if current < SCHEMA_VERSION:
            # hubs of an older release still running hear it as it commits, and stop
            # writing rows this schema could misread (their store's listener)
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{SCHEMA_NOTICE}{SCHEMA_VERSION}"))
