"""The network between a hub and PostgreSQL partitioned while 16 SDK senders stream
through it: packets dropped in the kernel (:mod:`tests.partition`), so nothing tells
the hub the database is gone, as when its host drops off the network or a failover
moves its address. A second hub, on a path that stays up, receives.

What must hold: no call hangs for the partition's length (each is answered, 503
``store_unavailable`` naming the database, within a bound), the partitioned hub serves
again soon after the network is back, its listener wakes a waiting long-poll again,
and every send the SDK was told succeeded is received once, a send retried under its
id after a failure at most once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from backchannel.client import SyncClient
from backchannel.errors import BackchannelError, PeerError
from backchannel.testing import eventually_blocking
from tests.partition import Partition, PartitionUnavailable
from tests.stores.test_postgres_hubs import drain, send, start_hubs, stop_all

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(240)]

SENDERS = 16
PARTITION_S = 45.0  # longer than any bound below: a call waiting it out fails the test
ANSWER_WITHIN = 30.0  # the SDK's timeout for one try: a try that hangs past it raises


@pytest.fixture
def partition(new_postgres_url: Callable[[], str]) -> Iterator[tuple[Partition, str]]:
    url = new_postgres_url()
    parts = urlsplit(url)
    try:
        path = Partition((parts.hostname or "127.0.0.1", parts.port or 5432))
    except PartitionUnavailable as exc:
        pytest.fail(f"this test needs a network partition and cannot make one: {exc}")
    with path:
        yield path, url


def test_a_partition_between_hub_and_database_hangs_no_call_and_loses_nothing(
    partition: tuple[Partition, str], tmp_path: Path
) -> None:
    path, url = partition
    far, near = start_hubs(tmp_path / "far", path.url(url), 1) + start_hubs(
        tmp_path / "near", url, 1
    )
    hubs = [far, near]
    try:
        tokens = far.team("np", "tx", "rx")
        answered: list[str] = []
        failures: list[tuple[str, str, float]] = []  # (error type, message, seconds taken)
        stop = threading.Event()

        def stream(worker: int) -> None:
            with SyncClient(far.url, tokens["tx"], timeout=ANSWER_WITHIN) as c:
                i = 0
                while not stop.is_set():
                    mid = f"w{worker}-{i}"
                    while not stop.is_set():  # told failed: made again under its id
                        t = time.monotonic()
                        try:
                            c.send("rx", mid, message_id=mid, link=False)
                        except BackchannelError as exc:
                            failures.append((type(exc).__name__, exc.message, time.monotonic() - t))
                            stop.wait(0.2)
                            continue
                        answered.append(mid)
                        break
                    i += 1

        senders = [threading.Thread(target=stream, args=(w,)) for w in range(SENDERS)]
        for t in senders:
            t.start()
        try:
            eventually_blocking(lambda: len(answered) >= 100, within=30, what="sends before")
            path.cut()
            cut_at = time.monotonic()
            stop.wait(PARTITION_S)
            path.heal()
            before = len(answered)
            eventually_blocking(
                lambda: len(answered) >= before + 100,
                within=20,
                what="sends answered after the network is back",
            )
        finally:
            stop.set()
            for t in senders:
                t.join(ANSWER_WITHIN + 15)
        # no try waited the partition out: each was answered, and said why
        hung = [f for f in failures if f[0] == PeerError.__name__]
        assert not hung, f"{len(hung)} calls hung past {ANSWER_WITHIN} s: {hung[:2]}"
        assert failures, "the partition was not felt"
        assert all("PostgreSQL" in m for _, m, _ in failures), failures[:3]
        assert time.monotonic() - cut_at > PARTITION_S

        # every answered send received once; one retried after a failure at most once
        want = set(answered)
        with near.client(tokens["rx"]) as rx:
            seen = drain(rx, lambda got: want <= {m["message_id"] for m in got}, 60)
        ids = [m["message_id"] for m in seen]
        assert want <= set(ids), sorted(want - set(ids))[:5]
        assert len(ids) == len(set(ids)), "a message received twice"

        # the partitioned hub's listener is back: a long-poll on it is woken by a send
        # through the other hub well before its own timeout
        got: dict[str, object] = {}
        with far.client(tokens["rx"]) as rx:

            def wait_on_far() -> None:
                r = rx.get("/v1/inbox", params={"wait": 20})
                got["at"], got["messages"] = time.monotonic(), r.json()["messages"]

            waiter = threading.Thread(target=wait_on_far)
            waiter.start()
            with near.client(tokens["tx"]) as tx:
                # the long-poll is waiting once its first lease found nothing; a send
                # before that only makes the wake-up quicker
                time.sleep(0.5)
                sent_at = time.monotonic()
                assert send(tx, "rx", "after", message_id="after").status_code == 201
            waiter.join(30)
        assert [m["message_id"] for m in got["messages"]] == ["after"]  # type: ignore[union-attr]
        assert got["at"] - sent_at < 5.0  # type: ignore[operator]
    finally:
        stop_all(hubs)
