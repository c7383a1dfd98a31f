"""pytest plugin: a PostgreSQL server for the session (see ``tests/pg_harness.py``).

Load it from ``tests/conftest.py`` with ``pytest_plugins = ["tests.conftest_pg"]``.
Fixtures:

* ``postgres_server`` (session) — the :class:`PgServer`, started on first use and
  stopped at the end of the session;
* ``postgres_url`` (session) — the URL of the session's database,
  ``postgresql://backchannel:<password>@127.0.0.1:<port>/<db>``;
* ``new_postgres_url`` (function) — a factory: each call creates an empty database on
  the same server and returns its URL.

If the server cannot be started the fixtures *fail* (never skip) with the reason and
the server log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.pg_harness import PgHarnessError, PgServer, start_postgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    try:
        server = start_postgres()
    except PgHarnessError as exc:
        pytest.fail(f"PostgreSQL is needed for these tests and could not be started:\n{exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PgServer) -> str:
    return postgres_server.url


@pytest.fixture
def new_postgres_url(postgres_server: PgServer) -> Callable[[], str]:
    return postgres_server.new_database
