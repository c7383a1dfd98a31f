"""The wall clock stepped under a running ``backchannel serve`` (NTP correcting a
machine after sleep, an operator setting the date): the process's ``time.time()`` is
moved by a ``sitecustomize`` that adds the offset written in a file, while its
monotonic and boot clocks run on, as a real step leaves them."""

from __future__ import annotations

import asyncio
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import eventually_blocking
from tests.conftest import Server, start_server

_SITECUSTOMIZE = textwrap.dedent(
    """
    import os
    import time

    _FILE = os.environ["BACKCHANNEL_TEST_CLOCK_OFFSET"]
    _time, _time_ns = time.time, time.time_ns


    def _offset():
        try:
            with open(_FILE) as f:
                return float(f.read() or 0)
        except (OSError, ValueError):
            return 0.0


    time.time = lambda: _time() + _offset()
    time.time_ns = lambda: _time_ns() + int(_offset() * 1e9)
    """
)


class SteppedServer:
    """A ``serve`` whose wall clock the test steps with :meth:`step`."""

    def __init__(self, srv: Server, offset_file: Path) -> None:
        self.srv = srv
        self._file = offset_file
        self.offset = 0.0

    def step(self, seconds: float) -> None:
        """Step the server's wall clock by ``seconds`` (every later read sees it)."""
        self.offset += seconds
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(repr(self.offset))
        tmp.replace(self._file)

    def log(self) -> str:
        return (self.srv.home / "serve.log").read_text()

    def nudge(self) -> None:
        """Commit a write to the server's SQLite file from this process: the server hears
        of it within a quarter second and runs a maintenance pass."""

        async def write() -> None:
            store = SqliteStore(self.srv.store_url.removeprefix("sqlite://"))
            async with Hub(store, background=False) as hub:
                await hub.send("t", "a", "c", "a write from another process")

        asyncio.run(write())


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[SteppedServer]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    offset_file = tmp_path / "offset"
    offset_file.write_text("0")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    srv = start_server(
        tmp_path / "home",
        env={"PYTHONPATH": path, "BACKCHANNEL_TEST_CLOCK_OFFSET": str(offset_file)},
    )
    try:
        yield SteppedServer(srv, offset_file)
    finally:
        srv.stop()


def _inbox(c: httpx.Client, **params: object) -> list[dict[str, object]]:
    r = c.get("/v1/inbox", params=params)
    r.raise_for_status()
    got: list[dict[str, object]] = r.json()["messages"]
    return got


def test_a_step_forward_takes_no_live_lease_back(stepped: SteppedServer) -> None:
    """The clock stepped an hour forward while b worked on a message leased for a minute:
    the lease still runs (its length again from the step), so no receive gets the message
    a second time, and b's ack settles it. Before, the next maintenance pass took every
    lease for run out and handed the message to b's next receive while b worked on it."""
    tokens = stepped.srv.team("t", "a", "b", "c")
    with (
        stepped.srv.client(tokens["a"]) as a,
        stepped.srv.client(tokens["b"]) as b,
    ):
        sent = a.post("/v1/messages", json={"to": "b", "text": "work on this"})
        sent.raise_for_status()
        message_id = sent.json()["message_id"]
        got = _inbox(b, lease=60)
        assert [m["message_id"] for m in got] == [message_id]

        stepped.step(3600)
        stepped.nudge()  # a maintenance pass now, whenever the next was due
        # b asks again while it works on the first (a second worker of b, a retry)
        assert _inbox(b, wait=3) == [], "the message was handed a second time"
        eventually_blocking(
            lambda: "stepped about 3600 s forward" in stepped.log() or None,
            what="the server's maintenance to see the step",
            show=stepped.log,
        )
        assert _inbox(b) == [], "the message was handed a second time"
        r = b.post("/v1/inbox/ack", json={"message_ids": [message_id]})
        r.raise_for_status()
        assert r.json().get("not_held", []) == [], r.json()
        status = a.get(f"/v1/messages/{message_id}")
        status.raise_for_status()
        assert status.json()["deliveries"][0]["attempts"] == 1, status.json()


def test_a_step_back_holds_no_lease_an_hour(stepped: SteppedServer) -> None:
    """The clock stepped an hour back while b held a message leased for 2 s and then
    stopped answering: the lease runs its length again from the step, so the message comes
    back within seconds, not an hour later, and once."""
    tokens = stepped.srv.team("t", "a", "b", "c")
    with (
        stepped.srv.client(tokens["a"]) as a,
        stepped.srv.client(tokens["b"]) as b,
    ):
        sent = a.post("/v1/messages", json={"to": "b", "text": "work on this"})
        sent.raise_for_status()
        message_id = sent.json()["message_id"]
        assert [m["message_id"] for m in _inbox(b, lease=2)] == [message_id]

        stepped.step(-3600)
        stepped.nudge()
        again = eventually_blocking(
            lambda: _inbox(b, wait=2, lease=60),
            what="the message back after its lease",
            within=20,
            show=stepped.log,
        )
        assert [(m["message_id"], m["attempt"]) for m in again] == [(message_id, 2)]
        r = b.post("/v1/inbox/ack", json={"message_ids": [message_id]})
        r.raise_for_status()
        assert _inbox(b) == []


def test_a_step_forward_fires_no_timer_early_under_serve(stepped: SteppedServer) -> None:
    """A 10-minute anchor set just before the clock stepped an hour forward still has its
    10 minutes after the step, and the session gets no breadcrumb: before, the next
    maintenance pass fired it at once (a model turn an hour early, as every timer due
    within the hour)."""
    tokens = stepped.srv.team("t", "a", "c")
    with stepped.srv.client(tokens["a"]) as a:
        a.post("/v1/sessions", json={"session_id": "a-s"}).raise_for_status()
        r = a.post("/v1/timers", json={"intent": "anchor", "note": "back to task 3"})
        assert r.status_code == 201, r.text
        timer_id = r.json()["timer_id"]

        stepped.step(3600)
        stepped.nudge()
        eventually_blocking(
            lambda: "stepped about 3600 s forward" in stepped.log() or None,
            what="the server's maintenance to see the step",
            show=stepped.log,
        )
        r = a.get("/v1/timers")
        r.raise_for_status()
        pending = [t for t in r.json()["timers"] if t["timer_id"] == timer_id]
        assert pending, "the timer fired an hour early"
        assert 580 < pending[0]["due_in"] <= 600, pending
        assert _inbox(a, session="a-s", wait=1) == [], "the timer fired an hour early"
