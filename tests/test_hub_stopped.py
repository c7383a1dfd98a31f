"""A hub that does not run for a while, and wakes: a laptop's lid closed, a process
stopped with SIGSTOP (or Ctrl-Z) and continued. Real ``backchannel serve`` processes,
stopped and continued with signals; receivers over HTTP."""

from __future__ import annotations

import concurrent.futures
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server, start_server


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    s = start_server(tmp_path / "home")
    try:
        yield s
    finally:
        s.proc.send_signal(signal.SIGCONT)
        s.stop()


def test_an_ack_sent_to_a_stopped_hub_is_answered_and_keeps_the_copy_from_others(
    srv: Server, request: pytest.FixtureRequest
) -> None:
    """``b``'s first receiver leases a message for 3 s and acks it within them, on its
    kept-alive connection, but the hub is stopped then: the ack waits in the hub's
    socket while the connection's keep-alive time (5 s) and the lease run out by the
    hub's clock, and a second receiver of ``b`` waits in a long-poll. When the hub
    continues, the ack is read and answered (the connection was reset, unread, when
    the keep-alive timer fired first), the message is acked once, and the second
    receiver is not handed it (a second copy to a model)."""
    tokens = srv.team("t", "b")
    user, r1, r2 = (srv.client(tokens[k]) for k in ("user", "b", "b"))
    for c in (user, r1, r2):
        request.addfinalizer(c.close)
    user.post("/v1/messages", json={"to": "b", "text": "one"}).raise_for_status()
    [got] = r1.get("/v1/inbox", params={"lease": 3}).json()["messages"]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(r2.get, "/v1/inbox", params={"wait": 10, "lease": 30})
        srv.proc.send_signal(signal.SIGSTOP)
        try:
            acked = pool.submit(r1.post, "/v1/inbox/ack", json={"message_ids": [got["message_id"]]})
            stopped = time.monotonic()
            while time.monotonic() - stopped < 8:  # past the lease and the keep-alive
                time.sleep(0.2)
        finally:
            srv.proc.send_signal(signal.SIGCONT)
        answer = acked.result(30)
        second = waiting.result(40)
    answer.raise_for_status()
    second.raise_for_status()
    assert answer.json() == {"acked": 1, "not_held": []}
    assert second.json()["messages"] == [], "handed to a second receive after a timely ack"
    status = user.get(f"/v1/messages/{got['message_id']}").json()
    assert status["status"] == "acked", status
