"""The PostgreSQL schema, as numbered migrations (see
:class:`backchannel.stores.postgres.PostgresStore`, which applies them).

It mirrors the SQLite schema. Every key starts with ``team``: every query is scoped to
one team, which is also what a sharded deployment distributes by (docs/postgres.md).
Migration ``n`` takes a database from version ``n - 1`` to ``n``; a migration is never
edited once released, only followed by a new one.
"""

from __future__ import annotations

from backchannel.stores.base import SCHEMA_VERSION

__all__ = ["MIGRATIONS"]

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
]
assert len(MIGRATIONS) == SCHEMA_VERSION
