"""The PostgreSQL server itself restarted under two `backchannel serve` processes: a fast
shutdown, or every process of it killed with SIGKILL (crash recovery), while senders
stream through one hub and a receiver long-polls the other. Every send answered 2xx is
received exactly once, and a long-poll on the other hub is woken by a send committed
after the restart well before its own timeout (the listener or its fallback timer is
back)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from backchannel.testing import eventually_blocking
from tests.pg_harness import PgHarnessError, PgServer, start_postgres
from tests.stores.test_postgres_hubs import (
    drain,
    send,
    send_until_answered,
    start_hubs,
    stop_all,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(120)]


@pytest.fixture
def own_server() -> PgServer:
    """A server of this test's own: restarting the session's would disturb the others."""
    try:
        return start_postgres()
    except PgHarnessError as exc:
        pytest.fail(f"PostgreSQL is needed for this test and could not be started:\n{exc}")


@pytest.mark.parametrize("crash", [False, True], ids=["fast-shutdown", "kill-9"])
def test_a_database_restart_under_two_hubs_loses_and_doubles_nothing(
    own_server: PgServer, tmp_path: Path, crash: bool
) -> None:
    srv = own_server
    hubs = []
    try:
        url = srv.new_database()
        with psycopg.connect(srv.admin_url, autocommit=True) as admin:
            # the harness runs with synchronous_commit=off; a crash must not undo a
            # commit the hub answered, as on a server with the defaults
            admin.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET synchronous_commit = on')
        a, b = hubs = start_hubs(tmp_path, url, 2)
        tokens = a.team("rs", "tx", "rx")
        answered: list[str] = []
        others: list[str] = []
        stop = threading.Event()

        def stream(worker: int) -> None:
            with a.client(tokens["tx"]) as c:
                c.timeout = httpx.Timeout(20.0)
                send_until_answered(c, f"c{worker}", stop, answered, others)

        senders = [threading.Thread(target=stream, args=(w,)) for w in range(2)]
        for t in senders:
            t.start()
        try:
            eventually_blocking(lambda: len(answered) >= 40, within=30, what="sends before")
            srv.restart(crash=crash)
            before = len(answered)
            eventually_blocking(
                lambda: len(answered) >= before + 40, within=30, what="sends after the restart"
            )
        finally:
            stop.set()
            for t in senders:
                t.join(30)
        assert not others, others[:3]
        want = set(answered)
        with b.client(tokens["rx"]) as rx:
            seen = drain(rx, lambda got: want <= {m["message_id"] for m in got}, 30)
            ids = [m["message_id"] for m in seen]
            assert want <= set(ids), sorted(want - set(ids))[:5]
            assert len(ids) == len(set(ids)), "a message received twice"

            # a long-poll on b, woken by a send through a well before its own 20 s
            got: dict[str, object] = {}

            def wait_on_b() -> None:
                r = rx.get("/v1/inbox", params={"wait": 20})
                got["at"], got["messages"] = time.monotonic(), r.json()["messages"]

            waiter = threading.Thread(target=wait_on_b)
            waiter.start()
            with a.client(tokens["tx"]) as tx:
                # the long-poll is waiting once its first lease found nothing; a send
                # before that only makes the wake-up quicker
                time.sleep(0.5)
                sent_at = time.monotonic()
                assert send(tx, "rx", "after", message_id="after").status_code == 201
            waiter.join(30)
            assert [m["message_id"] for m in got["messages"]] == ["after"]  # type: ignore[union-attr]
            assert got["at"] - sent_at < 10.0  # type: ignore[operator]
    finally:
        stop_all(hubs)
        srv.stop()
