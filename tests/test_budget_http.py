"""The loop backstop over the real HTTP API of a real ``backchannel serve``: scripted
agents that always answer, as a user would run them, stop at the pair budget."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.conftest import Server


def _setup(server: Server, **settings: Any) -> dict[str, httpx.Client]:
    with server.client() as admin:
        r = admin.post(
            "/v1/teams", json={"name": "t", "settings": {"anchor_policy": "off", **settings}}
        )
        r.raise_for_status()
        tokens = {"user": r.json()["user_token"]}
        for m in ("a", "b"):
            r = admin.post("/v1/teams/t/members", json={"name": m})
            r.raise_for_status()
            tokens[m] = r.json()["token"]
    return {name: server.client(token) for name, token in tokens.items()}


class HttpAgent:
    """Answers everything it gets; re-sends whenever its link closes."""

    def __init__(self, c: httpx.Client, name: str, peer: str, *, sessions: bool) -> None:
        self.c, self.name, self.peer = c, name, peer
        self.session = f"{name}-s" if sessions else None
        self.turns = 0
        self.statuses: list[int] = []
        self.errors: list[dict[str, Any]] = []
        self.inputs: list[dict[str, Any]] = []
        if self.session:
            c.post("/v1/sessions", json={"session_id": self.session}).raise_for_status()

    def send(self, text: str, *, link: bool) -> None:
        body = {"to": self.peer, "text": text, "link": link, "from_session": self.session}
        r = self.c.post("/v1/messages", json=body)
        self.statuses.append(r.status_code)
        if r.status_code >= 400:
            self.errors.append(r.json()["error"])

    def event(self, kind: str, text: str = "") -> dict[str, Any]:
        r = self.c.post(f"/v1/sessions/{self.session}/events", json={"kind": kind, "text": text})
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def step(self) -> bool:
        params: dict[str, Any] = {"limit": 100}
        if self.session:
            params["session"] = self.session
        got = self.c.get("/v1/inbox", params=params).json()["messages"]
        if not got:
            return False
        self.c.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got]})
        self.inputs += got
        self.turns += 1
        if self.session is None:  # no sessions: answer every input with a plain send
            self.send(f"{self.name} answers {self.turns}", link=False)
            return True
        self.event("turn_start", "\n".join(m["text"] for m in got))
        closed = any(m["meta"].get("event") == "closed" for m in got)
        closing = f"{self.name} answers {self.turns}"
        if closed or (self.name == "a" and self.turns == 1):
            self.send(f"{self.name} (re)opens {self.turns}", link=True)
            closing = ""
        self.event("agent_stop", closing)
        return True


def _run(*agents: HttpAgent, cap: int = 300) -> None:
    for _ in range(cap):
        stepped = [a.step() for a in agents]  # every agent takes its turn each round
        if not any(stepped):
            return
    raise AssertionError("the agents were still talking: no budget stopped them")


def test_links_with_re_sends_stop_at_the_pair_budget_over_http(server: Server) -> None:
    clients = _setup(server, link_budget=3, pair_budget=8)
    try:
        _links_stop(clients)
    finally:
        for c in clients.values():
            c.close()


def _links_stop(clients: dict[str, httpx.Client]) -> None:
    a = HttpAgent(clients["a"], "a", "b", sessions=True)
    b = HttpAgent(clients["b"], "b", "a", sessions=True)
    clients["user"].post("/v1/messages", json={"to": "a", "text": "start"}).raise_for_status()
    _run(a, b)
    sent_to_b = [m for m in b.inputs if m["from"] == "a" and m["kind"] in ("direct", "link")]
    sent_to_a = [m for m in a.inputs if m["from"] == "b" and m["kind"] in ("direct", "link")]
    assert len(sent_to_a) + len(sent_to_b) == 8
    links = clients["a"].get("/v1/links").json()["links"]
    assert len(links) >= 2 and all(link["state"] == "closed" for link in links)
    refused = [s for s in a.statuses + b.statuses if s == 429]
    assert refused, "the re-send past the budget is refused"
    err = (a.errors + b.errors)[0]
    assert err["code"] == "budget_exhausted" and err["budget"] == "pair"
    assert err["resets_at"] is not None and "user" in err["message"]
    for agent in (a, b):
        assert any(
            m["kind"] == "system" and m["meta"].get("budget") == "pair" for m in agent.inputs
        )
    told = clients["user"].get("/v1/inbox", params={"limit": 100}).json()["messages"]
    assert any(m["meta"].get("budget") == "pair" for m in told), "the team's human is told"
    assert all(m["chain_id"] and m["hop"] >= 1 for m in sent_to_a + sent_to_b)


def test_plain_sends_stop_and_an_extension_lets_exactly_that_many_through(server: Server) -> None:
    clients = _setup(server, pair_budget=5)
    try:
        _plain_and_extend(server, clients)
    finally:
        for c in clients.values():
            c.close()


def _plain_and_extend(server: Server, clients: dict[str, httpx.Client]) -> None:
    a = HttpAgent(clients["a"], "a", "b", sessions=False)
    b = HttpAgent(clients["b"], "b", "a", sessions=False)
    a.send("a starts", link=False)
    _run(a, b)
    assert [s for s in a.statuses + b.statuses if s == 201] == [201] * 5
    assert 429 in a.statuses + b.statuses
    budgets = clients["user"].get("/v1/teams/t/budgets").json()["budgets"]
    assert [(x["key"], x["used"], x["limit"], x["spent"]) for x in budgets] == [
        ("pair:a|b", 5, 5, True)
    ]
    snap = clients["user"].get("/v1/dashboard/teams/t/snapshot").json()
    assert [(x["key"], x["spent"]) for x in snap["budgets"]] == [("pair:a|b", True)]
    r = clients["a"].post("/v1/teams/t/budgets/extend", json={"key": "pair:a|b", "by": 3})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden")
    r = clients["a"].post("/v1/dashboard/teams/t/budgets/extend", json={"key": "pair:a|b", "by": 3})
    assert r.status_code == 403, "the dashboard's extend action is the human's too"
    r = clients["user"].post(
        "/v1/dashboard/teams/t/budgets/extend", json={"key": "pair:a|b", "by": 3}
    )
    assert r.status_code == 200 and (r.json()["used"], r.json()["limit"]) == (5, 8)
    _run(a, b)  # the extension notice reaches both; they answer it, and each other
    assert [s for s in a.statuses + b.statuses if s == 201] == [201] * 8
    with server.client() as admin:
        r = admin.post("/v1/teams/t/budgets/extend", json={"key": "pair:a|b", "by": 1})
        assert r.status_code == 200 and r.json()["limit"] == 9
        r = admin.post("/v1/teams/t/budgets/extend", json={"key": "nonsense", "by": 1})
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_request")


def test_the_cli_lists_and_extends_budgets(server: Server) -> None:
    from tests.test_cli import run

    clients = _setup(server, pair_budget=2)
    try:
        for who, to in (("a", "b"), ("b", "a")):
            r = clients[who].post("/v1/messages", json={"to": to, "text": "hi", "link": False})
            assert r.status_code == 201
        env = {"BACKCHANNEL_HOME": str(server.home)}  # the admin token on the hub's host
        listed = run("budget", "list", "t", env=env)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines() == ["pair:a|b\t2/2\tSPENT"]
        bad = run("budget", "extend", "t", "pair:a|zed", "--by", "2", env=env)
        assert bad.returncode == 1 and "zed" in bad.stderr
        ext = run("budget", "extend", "t", "pair:a|b", "--by", "2", env=env)
        assert ext.returncode == 0, ext.stderr
        assert (json.loads(ext.stdout)["limit"], json.loads(ext.stdout)["spent"]) == (4, False)
        # an anchor set without a time is due after the default of 10 minutes
        clients["a"].post("/v1/sessions", json={"session_id": "a-s"}).raise_for_status()
        r = clients["a"].post("/v1/timers", json={"intent": "anchor", "note": "back to work"})
        assert r.status_code == 201 and 599 <= r.json()["due_in"] <= 600
        r = clients["a"].post("/v1/timers", json={"intent": "check", "note": "b?", "target": "b"})
        assert r.status_code == 422, "only an anchor has a default time"
        as_agent = run(
            "budget",
            "extend",
            "t",
            "pair:a|b",
            "--by",
            "2",
            "--token",
            _token(clients["a"]),
            env=env,
        )
        assert as_agent.returncode == 1 and "only the team's human" in as_agent.stderr
    finally:
        for c in clients.values():
            c.close()


def _token(c: httpx.Client) -> str:
    return str(c.headers["Authorization"]).removeprefix("Bearer ")
