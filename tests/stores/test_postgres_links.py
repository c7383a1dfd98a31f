"""Links across two ``backchannel serve`` processes on one PostgreSQL: each end of a
link on a hub of its own, both ends' turns ending at the same moment."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server
from tests.pg_harness import PgServer
from tests.stores.test_postgres_hubs import start_hubs, stop_all
from tests.test_budget_http import HttpAgent

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(120)]


@pytest.fixture
def hubs(postgres_server: PgServer, tmp_path: Path) -> Iterator[list[Server]]:
    servers = start_hubs(tmp_path, postgres_server.new_database("links"), 2)
    try:
        yield servers
    finally:
        stop_all(servers)


def _lockstep(*agents: HttpAgent, cap: int = 100) -> None:
    """Every agent takes its turn at the same moment each round, until none has input."""

    def run(i: int, start: threading.Barrier, stepped: list[bool]) -> None:
        start.wait(10)
        stepped[i] = agents[i].step()

    for _ in range(cap):
        stepped = [False] * len(agents)
        start = threading.Barrier(len(agents))
        threads = [
            threading.Thread(target=run, args=(i, start, stepped)) for i in range(len(agents))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if not any(stepped):
            return
    raise AssertionError("the agents were still talking: no budget stopped them")


def test_both_ends_on_two_hubs_cross_each_output_once_within_the_budgets(
    hubs: list[Server],
) -> None:
    one, two = hubs
    with one.client() as admin:
        r = admin.post(
            "/v1/teams",
            json={"name": "t", "settings": {"anchor_policy": "off", "link_budget": 3,
                                            "pair_budget": 9}},
        )  # fmt: skip
        r.raise_for_status()
        user = r.json()["user_token"]
        tokens = {}
        for m in ("a", "b"):
            r = admin.post("/v1/teams/t/members", json={"name": m})
            r.raise_for_status()
            tokens[m] = r.json()["token"]
    clients = [one.client(tokens["a"]), two.client(tokens["b"]), one.client(user)]
    try:
        a = HttpAgent(clients[0], "a", "b", sessions=True)  # a's end on the first hub
        b = HttpAgent(clients[1], "b", "a", sessions=True)  # b's on the second
        clients[2].post("/v1/messages", json={"to": "a", "text": "start"}).raise_for_status()
        _lockstep(a, b)
        got = [
            m
            for x in (a, b)
            for m in x.inputs
            if m["kind"] in ("direct", "link") and m["from"] in ("a", "b")
        ]
        ids = Counter(m["message_id"] for m in got)
        assert [i for i, n in ids.items() if n > 1] == [], "nothing reached a model twice"
        texts = Counter((m["to"], m["text"]) for m in got)
        assert [t for t, n in texts.items() if n > 1] == []
        # stopped (``_lockstep`` ends), by the pair budget (an exchange is a change of
        # speaker: a crossing and a re-send of one turn are one)
        budgets = clients[2].get("/v1/teams/t/budgets").json()["budgets"]
        assert [(x["key"], x["used"], x["spent"]) for x in budgets] == [("pair:a|b", 9, True)]
        links = clients[0].get("/v1/links").json()["links"]
        assert all(link["state"] == "closed" for link in links)
        assert all(link["turns_used"] <= 3 for link in links)
    finally:
        for c in clients:
            c.close()
