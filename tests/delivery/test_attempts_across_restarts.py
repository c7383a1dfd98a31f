"""A hub stopped cleanly (SIGTERM) while its push worker holds a member's copies gives
back those it never tried without counting their lease as an attempt: a few restarts
must not spend the attempts of a message nobody failed on. Real ``backchannel serve``
processes on one SQLite file, a webhook target on 127.0.0.1."""

from __future__ import annotations

import subprocess
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from backchannel.testing.waiting import eventually_blocking
from tests.conftest import Server, start_server
from tests.peers import Peer, QuietHandler


class Target(Peer):
    """A webhook target: it records the message id of each POST; while :attr:`open` is
    not set it holds each request (the push under way when the hub stops), then answers
    503 once for the ids in :attr:`fail_once` and 200 otherwise."""

    def __init__(self) -> None:
        self.got: list[str] = []
        self.open = threading.Event()
        self.fail_once: set[str] = set()
        lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                mid = self.headers.get("X-Backchannel-Message-Id", "")
                with lock:
                    outer.got.append(mid)
                outer.open.wait(60)
                with lock:
                    failing = mid in outer.fail_once
                    outer.fail_once.discard(mid)
                self.send_response(503 if failing else 200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.serve(Handler)


def _serve(home: Path, target: Target) -> Server:
    env = {"BACKCHANNEL_CALLBACKS": f"hook={target.url}"}
    return start_server(home, None, "--max-attempts", "2", env=env)


def _stop_cleanly(srv: Server) -> None:
    srv.proc.terminate()  # SIGTERM: the hub stops as it is asked to, no crash
    try:
        srv.proc.wait(30)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        raise AssertionError("serve did not stop on SIGTERM within 30 s") from None


def _pushed(target: Target, mid: str, times: int) -> bool:
    return target.got.count(mid) == times


def _delivery(srv: Server, token: str, mid: str) -> dict[str, Any]:
    with srv.client(token) as c:
        got: dict[str, Any] = c.get(f"/v1/messages/{mid}").json()["deliveries"][0]
        return got


@pytest.mark.slow
def test_clean_restarts_during_a_push_spend_no_attempt_of_the_copies_behind_it(
    tmp_path: Path,
) -> None:
    # the worker leased three copies and was pushing the first to a target that hangs
    # when the hub was stopped, three times: the two behind it were given back untried
    # each time, and each give-back counted as one of their attempts (max 2 here), so the
    # first transient failure of one of them (a 503) dead-lettered it, "gave up after 4
    # attempt(s)", its sender told of a message nobody had failed on. Now a lease the
    # hub gives back untried is not counted: it is retried and delivered.
    target = Target()
    home = tmp_path / "home"
    srv = _serve(home, target)
    try:
        tokens = srv.team("restarts", "a", "w")
        with srv.client() as admin:
            admin.patch(
                "/v1/teams/restarts/members/w",
                json={"delivery": {"type": "webhook", "service": "hook"}},
            ).raise_for_status()
        with srv.client(tokens["a"]) as a:
            ids = [
                a.post("/v1/messages", json={"to": "w", "text": f"part {i}"}).json()["message_id"]
                for i in range(3)
            ]
        for n in range(1, 4):
            eventually_blocking(
                partial(_pushed, target, ids[0], n),
                what=f"push {n} of the first message to reach the target",
                within=30,
                show=lambda: target.got,
            )
            assert set(target.got) == {ids[0]}, "the copies behind it were never pushed"
            _stop_cleanly(srv)
            srv = _serve(home, target)
        target.fail_once.add(ids[1])
        target.open.set()

        def settled() -> list[dict[str, Any]] | None:
            got = [_delivery(srv, tokens["a"], mid) for mid in ids]
            done = all(d["state"] in ("acked", "delivered", "dead") for d in got)
            return got if done else None

        got = eventually_blocking(settled, what="every copy to be settled", within=60)
        assert [d["dead_reason"] for d in got] == [None, None, None]
        # the second: one failure and one success; the third: pushed once
        assert [d["attempts"] for d in got[1:]] == [2, 1]
        assert target.got.count(ids[1]) == 2 and target.got.count(ids[2]) == 1
    finally:
        target.open.set()
        srv.stop()
        target.close()
