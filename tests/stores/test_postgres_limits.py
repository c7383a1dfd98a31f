"""PostgreSQL failing the way a database fails in the field: limits a DBA set on the
hub's role or database (``lock_timeout``, ``statement_timeout``, ``CONNECTION LIMIT``),
and a database that became read-only (a failover to a standby). Each must end in an
error that names the problem and the way out, lose nothing, and let the hub go on once
the cause is gone."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from backchannel.errors import StoreError
from backchannel.stores.postgres import PostgresStore
from backchannel.stores.postgres.transaction import _lock_key
from tests.pg_harness import PgServer
from tests.stores.test_postgres_extra import TEAM, copies_of, send, setup_team

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]


def _dbname(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _alter_database(server: PgServer, url: str, setting: str) -> None:
    with psycopg.connect(server.admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{_dbname(url)}" {setting}')  # names are ours


@contextmanager
def _team_lock_held(url: str) -> Iterator[None]:
    """Another session holds the team's lock, as a hub in a long transaction would."""
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (_lock_key(TEAM),))
        yield
        other.execute("SELECT pg_advisory_unlock(%s)", (_lock_key(TEAM),))


@pytest.mark.parametrize(
    ("setting", "named", "way_out"),
    [
        ("lock_timeout", "lock_timeout", "SET lock_timeout = 0"),
        ("statement_timeout", "statement_timeout", "SET statement_timeout = 0"),
    ],
)
async def test_a_timeout_set_by_a_dba_is_named_not_taken_for_a_lost_connection(
    postgres_server: PgServer, setting: str, named: str, way_out: str
) -> None:
    url = postgres_server.new_database()
    _alter_database(postgres_server, url, f"SET {setting} = '300ms'")
    store = PostgresStore(url, connect_timeout=5)
    await store.open()
    try:
        await store.transact(setup_team)
        with _team_lock_held(url), pytest.raises(StoreError) as info:
            await store.transact(send("m1"))
        text = str(info.value)
        assert named in text and way_out in text, text
        assert "losing its connection" not in text, text
        assert store.retries == 0, "a cancelled statement is not a lost connection to retry"
        assert await store.read(copies_of("m1")) == []  # nothing half-stored
        # the hub goes on, and the caller's retry stores the message once
        assert await store.transact(send("m1")) == "inserted"
        assert len(await store.read(copies_of("m1"))) == 1
    finally:
        await store.close()


async def test_a_read_only_database_at_start_says_so_and_names_the_way_out(
    postgres_server: PgServer,
) -> None:
    url = postgres_server.new_database()
    first = PostgresStore(url, connect_timeout=5)
    await first.open()  # the schema is there: only the read-only state stops the start
    await first.close()
    _alter_database(postgres_server, url, "SET default_transaction_read_only = on")
    with pytest.raises(StoreError) as info:
        await PostgresStore(url, connect_timeout=5).open()
    text = str(info.value)
    assert "read-only" in text and "standby" in text and "primary" in text, text
    assert "target_session_attrs=read-write" in text, text
    assert "retry shortly" not in text, text  # retrying the same server will not help


async def test_a_database_turned_read_only_under_a_running_hub_says_so_then_recovers(
    postgres_server: PgServer,
) -> None:
    url = postgres_server.new_database()
    store = PostgresStore(url, connect_timeout=5)
    await store.open()
    try:
        await store.transact(setup_team)
        _alter_database(postgres_server, url, "SET default_transaction_read_only = on")
        with psycopg.connect(url, autocommit=True) as admin:  # the failover: new sessions
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'backchannel' AND datname = current_database()"
            )
        with pytest.raises(StoreError) as info:
            await store.transact(send("m1"))
        text = str(info.value)
        assert "read-only" in text and "primary" in text, text
        assert await store.read(copies_of("m1")) == []
        _alter_database(postgres_server, url, "RESET default_transaction_read_only")
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'backchannel' AND datname = current_database()"
            )
        assert await store.transact(send("m1")) == "inserted"
    finally:
        await store.close()


async def test_no_connection_left_for_the_role_at_start_names_the_limit(
    postgres_server: PgServer, new_postgres_url: Callable[[], str]
) -> None:
    url = new_postgres_url()
    role, password = f"hub_{secrets.token_hex(4)}", secrets.token_hex(8)
    with psycopg.connect(postgres_server.admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0 PASSWORD '{password}'")
    parts = urlsplit(url)
    limited = urlunsplit(parts._replace(netloc=f"{role}:{password}@{parts.hostname}:{parts.port}"))
    with pytest.raises(StoreError) as info:
        await PostgresStore(limited, connect_timeout=5).open()
    text = str(info.value)
    assert "too many connections" in text, text
    assert "max_connections" in text and "CONNECTION LIMIT" in text, text
    assert "password are right" not in text, text  # the credentials are fine
    assert password not in text
