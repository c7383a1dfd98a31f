"""The PostgreSQL schema as numbered migrations, and the mapping between rows and the
values of :mod:`backchannel.types` (used by :mod:`backchannel.stores.postgres.tx`).

The schema mirrors the SQLite one. Team-owned tables are keyed by ``team`` first, since
every query about them is scoped to one team, which is also what a sharded deployment
distributes by (docs/postgres.md); ``jobs`` (keyed by a global id) and ``spent_tokens``
are the exceptions. Migration ``n`` takes a database from version ``n - 1`` to ``n``; a
released migration is never edited, only followed by a new one. JSON values are
``jsonb``; times are UNIX seconds in ``double precision``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from backchannel.errors import StoreError
from backchannel.stores.base import SCHEMA_VERSION
from backchannel.types import (
    Delegation,
    DelegationState,
    Delivery,
    DeliveryState,
    Job,
    JobState,
    Link,
    LinkState,
    Member,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    Route,
    Session,
    SessionState,
)

__all__ = ["MIGRATIONS", "migrate"]

log = logging.getLogger("backchannel.stores.postgres")
_MIGRATION_LOCK = 0x6263_6D69_6772_6174  # "bcmigrat"

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


# -- row mapping: column lists and row <-> value converters -----------------------------

_MSG_COLS = (
    "m.team, m.message_id, m.sender, m.to_name, m.text, m.kind, m.created_at, "
    "m.fingerprint, m.summary, m.sender_session, m.meta, m.chain_id, m.hop"
)
_DELIVERY_COLS = (
    "team, message_id, member, session, seq, state, attempts, created_at, updated_at, "
    "lease_until, dead_reason"
)
_MEMBER_COLS = "team, name, kind, created_at, token_hash, delivery, settings"
_JOB_COLS = "team, kind, due_at, created_at, session_id, payload, state, job_id, done_at"
_LINK_COLS = (
    "team, link_id, initiator, initiator_session, responder, responder_session, budget, "
    "created_at, state, turns_used, closed_at, close_reason, history"
)
_SESSION_COLS = (
    "team, session_id, member, state, created_at, updated_at, turn, turn_started_at, "
    "turn_kind, last_output, last_stop_at, meta"
)


def _dump(value: Mapping[str, Any] | None) -> Jsonb:
    return Jsonb(dict(value) if value else {})


def _message(r: Sequence[Any]) -> Message:
    return Message(
        team=r[0], message_id=r[1], sender=r[2], to=r[3], text=r[4], kind=MessageKind(r[5]),
        created_at=r[6], fingerprint=r[7], summary=r[8], sender_session=r[9], meta=r[10] or {},
        chain_id=r[11], hop=r[12],
    )  # fmt: skip


def _delivery(r: Sequence[Any]) -> Delivery:
    return Delivery(
        team=r[0], message_id=r[1], recipient=Recipient(r[2], r[3]), seq=r[4],
        state=DeliveryState(r[5]), attempts=r[6], created_at=r[7], updated_at=r[8],
        lease_until=r[9], dead_reason=r[10],
    )  # fmt: skip


def _job(r: Sequence[Any]) -> Job:
    return Job(
        team=r[0], kind=r[1], due_at=r[2], created_at=r[3], session_id=r[4],
        payload=r[5] or {}, state=JobState(r[6]), job_id=r[7], done_at=r[8],
    )  # fmt: skip


def _link(r: Sequence[Any]) -> Link:
    return Link(
        team=r[0], link_id=r[1], initiator=r[2], initiator_session=r[3], responder=r[4],
        responder_session=r[5], budget=r[6], created_at=r[7], state=LinkState(r[8]),
        turns_used=r[9], closed_at=r[10], close_reason=r[11], history=tuple(r[12] or ()),
    )  # fmt: skip


def _link_args(k: Link) -> tuple[Any, ...]:
    return (
        k.team, k.link_id, k.initiator, k.initiator_session, k.responder, k.responder_session,
        k.budget, k.created_at, k.state.value, k.turns_used, k.closed_at, k.close_reason,
        Jsonb([dict(h) for h in k.history]),
    )  # fmt: skip


_DEL_COLS = (
    "team, delegation_id, route, caller, caller_session, tool_use_id, callee, task, "
    "created_at, deadline, batch, callee_session, state, result, error, answered_at, "
    "reply_service, reply_token"
)


def _delegation(r: Sequence[Any]) -> Delegation:
    return Delegation(
        team=r[0], delegation_id=r[1], route=Route(r[2]), caller=r[3], caller_session=r[4],
        tool_use_id=r[5], callee=r[6], task=r[7], created_at=r[8], deadline=r[9], batch=r[10],
        callee_session=r[11], state=DelegationState(r[12]), result=r[13], error=r[14],
        answered_at=r[15], reply_service=r[16], reply_token=r[17],
    )  # fmt: skip


def _delegation_args(d: Delegation) -> tuple[Any, ...]:
    return (
        d.team, d.delegation_id, d.route.value, d.caller, d.caller_session, d.tool_use_id,
        d.callee, d.task, d.created_at, d.deadline, d.batch, d.callee_session, d.state.value,
        d.result, d.error, d.answered_at, d.reply_service, d.reply_token,
    )  # fmt: skip


def _member(r: Sequence[Any]) -> Member:
    return Member(
        team=r[0], name=r[1], kind=MemberKind(r[2]), created_at=r[3], token_hash=r[4],
        delivery=r[5] or {}, settings=r[6] or {},
    )  # fmt: skip


def _session(r: Sequence[Any]) -> Session:
    return Session(
        team=r[0], session_id=r[1], member=r[2], state=SessionState(r[3]), created_at=r[4],
        updated_at=r[5], turn=r[6], turn_started_at=r[7], turn_kind=r[8], last_output=r[9],
        last_stop_at=r[10], meta=r[11] or {},
    )  # fmt: skip
