"""A PostgreSQL server frozen under a hub (every process of it stopped with SIGSTOP, as a
paused VM or a host stalled in swap): its sockets stay open and its kernel acknowledges
every byte and keepalive probe, so nothing at the TCP level tells the hub. A server of
the test's own is frozen, never the session's.

What must hold: the sends in flight when it froze are each answered within a bound with
a 503 naming the database and the way out (not left waiting until it resumes); once it
resumes the hub serves again, and every send, made again under its id as a client does,
is received once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from backchannel.testing import eventually_blocking
from tests.pg_harness import PgServer
from tests.stores.test_postgres_hubs import drain, send, start_hubs, stop_all
from tests.stores.test_postgres_restart import own_server  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(180)]

SENDERS = 4
#: the longest a send in flight may wait on the frozen server for its answer
ANSWER_WITHIN = 25.0
#: how long the server stays frozen at most: past the bound, so a send waiting it out
#: is seen waiting
FROZEN_FOR = ANSWER_WITHIN + 15.0


def test_a_frozen_database_answers_the_sends_in_flight_503_and_loses_nothing(
    own_server: PgServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    srv = own_server
    hubs = []
    try:
        (hub,) = hubs = start_hubs(tmp_path, srv.new_database(), 1)
        tokens = hub.team("fz", "tx", "rx")
        with hub.client(tokens["tx"]) as tx:
            assert send(tx, "rx", "before", message_id="before").status_code == 201
        answers: dict[str, tuple[int, str, float]] = {}  # id -> (status, body, seconds)

        def in_flight(mid: str) -> None:
            with hub.client(tokens["tx"]) as c:
                c.timeout = httpx.Timeout(FROZEN_FOR + 30)
                t = time.monotonic()
                r = send(c, "rx", mid, message_id=mid)
                answers[mid] = (r.status_code, r.text, time.monotonic() - t)

        mids = [f"frozen-{i}" for i in range(SENDERS)]
        senders = [threading.Thread(target=in_flight, args=(mid,)) for mid in mids]
        with srv.frozen():
            for t in senders:
                t.start()
            deadline = time.monotonic() + FROZEN_FOR
            for t in senders:
                t.join(max(0.0, deadline - time.monotonic()))
        for t in senders:
            t.join(60)
        assert set(answers) == set(mids), answers
        for mid, (status, body, took) in answers.items():
            assert took < ANSWER_WITHIN, (mid, status, body, took)
            assert status == 503, (mid, status, body)
            error = httpx.Response(status, text=body).json()["error"]
            assert "PostgreSQL" in error["message"] and "retry" in error["message"], error

        # resumed: the hub serves again, and each send made again under its id lands once
        with hub.client(tokens["tx"]) as tx:
            for mid in [*mids, "after"]:

                def sent(mid: str = mid) -> bool:
                    return send(tx, "rx", mid, message_id=mid).status_code in (200, 201)

                eventually_blocking(sent, within=30, what=f"the send {mid} after the thaw")
        want = {"before", *mids, "after"}
        with hub.client(tokens["rx"]) as rx:
            seen = drain(rx, lambda got: want <= {m["message_id"] for m in got}, 30)
        ids = [m["message_id"] for m in seen]
        assert sorted(ids) == sorted(want), ids
    finally:
        stop_all(hubs)
        srv.stop()
