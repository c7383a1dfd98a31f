"""Batch sends and acks: each item is checked and answered on its own; one bad item
loses none of the others; limits answer 413 and 422 with the error model. The same
calls through the SDK answer the same over HTTP and in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from backchannel import Client
from backchannel.client import HttpTransport
from backchannel.hub import Hub
from backchannel.interfaces.http import create_app
from backchannel.models import MAX_BATCH
from backchannel.stores.memory import MemoryStore

ADMIN = "admin-token"


@dataclass
class Rig:
    hub: Hub
    http: httpx.AsyncClient
    tokens: dict[str, str]

    def over_http(self, member: str) -> Client:
        transport = httpx.ASGITransport(app=self.http._transport.app)  # type: ignore[attr-defined]
        return Client.over(HttpTransport("http://hub", self.tokens[member], transport=transport))

    def in_process(self, member: str) -> Client:
        return Client.local(self.hub, self.tokens[member])

    def auth(self, member: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[member]}"}


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    hub = Hub(MemoryStore())
    await hub.start()
    app = create_app(hub, ADMIN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://hub"
    ) as http:
        admin = Client.local(hub)
        await admin.start()
        team = await admin.create_team("t")
        tokens = {"user": team.user_token}
        for name in ("a", "b"):
            tokens[name] = (await admin.add_member("t", name)).token
        yield Rig(hub, http, tokens)
    await hub.close()


async def test_a_batch_send_answers_each_item_and_sends_the_good_ones(rig: Rig) -> None:
    body = {
        "messages": [
            {"to": "b", "text": "one", "message_id": "m-1"},
            {"to": "bb", "text": "nobody"},
            {"to": "b", "text": 5},
            "not an object",
            {"to": "b", "text": "two", "message_id": "m-2"},
            {"to": "b", "text": "one", "message_id": "m-1"},
        ]
    }
    r = await rig.http.post("/v1/messages/batch", json=body, headers=rig.auth("a"))
    assert r.status_code == 200, r.text
    got = r.json()
    statuses = [item["status"] for item in got["results"]]
    assert statuses[:5] == [201, 404, 422, 422, 201]
    assert statuses[5] in (200, 201)  # the same id again: one of the two replays
    assert got["results"][1]["error"]["code"] == "unknown_recipient"
    assert got["results"][1]["error"]["suggestions"] == ["b"]
    assert got["results"][2]["error"]["code"] == "invalid_request"
    assert [item["index"] for item in got["results"]] == list(range(6))
    assert (got["sent"], got["failed"]) == (3, 3)
    inbox = await rig.http.get("/v1/inbox", params={"limit": 10}, headers=rig.auth("b"))
    assert sorted(m["text"] for m in inbox.json()["messages"]) == ["one", "two"]


async def test_batch_limits_are_clear_errors(rig: Rig) -> None:
    too_many = {"messages": [{"to": "b", "text": "x"}] * (MAX_BATCH + 1)}
    r = await rig.http.post("/v1/messages/batch", json=too_many, headers=rig.auth("a"))
    assert r.status_code == 422
    assert "messages" in r.json()["error"]["message"]
    empty = await rig.http.post("/v1/messages/batch", json={"messages": []}, headers=rig.auth("a"))
    assert empty.status_code == 422
    huge = "x" * (rig.hub.config.max_text + 1)
    r = await rig.http.post(
        "/v1/messages/batch",
        json={"messages": [{"to": "b", "text": huge}, {"to": "b", "text": "fine"}]},
        headers=rig.auth("a"),
    )
    assert r.status_code == 200
    assert [i["status"] for i in r.json()["results"]] == [413, 201]
    admin = await rig.http.post(
        "/v1/messages/batch",
        json={"messages": [{"to": "b", "text": "x"}]},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert admin.status_code == 403


async def test_a_batch_ack_answers_each_id(rig: Rig) -> None:
    for i in range(3):
        await rig.http.post(
            "/v1/messages", json={"to": "b", "text": f"m{i}"}, headers=rig.auth("a")
        )
    inbox = await rig.http.get("/v1/inbox", params={"limit": 2}, headers=rig.auth("b"))
    held = [m["message_id"] for m in inbox.json()["messages"]]
    ids = [held[0], "not-held", "bad id!", 7, held[1]]
    r = await rig.http.post("/v1/inbox/ack/batch", json={"message_ids": ids}, headers=rig.auth("b"))
    assert r.status_code == 200, r.text
    got = r.json()
    assert [x["outcome"] for x in got["results"]] == [
        "acked", "not_held", "invalid", "invalid", "acked"
    ]  # fmt: skip
    assert (got["acked"], got["not_held"], got["invalid"]) == (2, 1, 2)
    pending = await rig.http.get("/v1/inbox/pending", headers=rig.auth("b"))
    assert pending.json() == {"pending": 1}


async def test_a_batch_ack_calls_an_id_with_a_line_end_invalid(rig: Rig) -> None:
    # an id read with its line end is malformed, as POST /v1/inbox/ack says; "not_held"
    # would tell the receiver its lease ran out while the message stays leased to it
    await rig.http.post("/v1/messages", json={"to": "b", "text": "m"}, headers=rig.auth("a"))
    inbox = await rig.http.get("/v1/inbox", headers=rig.auth("b"))
    held = inbox.json()["messages"][0]["message_id"]
    ids = [held + "\n", held + "\r\n"]
    r = await rig.http.post("/v1/inbox/ack/batch", json={"message_ids": ids}, headers=rig.auth("b"))
    assert r.status_code == 200, r.text
    assert [x["outcome"] for x in r.json()["results"]] == ["invalid", "invalid"]
    single = await rig.http.post(
        "/v1/inbox/ack", json={"message_ids": [held + "\n"]}, headers=rig.auth("b")
    )
    assert single.status_code == 422


@pytest.mark.parametrize("where", ["over_http", "in_process"])
async def test_the_sdk_batches_the_same_either_way(rig: Rig, where: str) -> None:
    async with getattr(rig, where)("a") as a, getattr(rig, where)("b") as b:
        sent = await a.send_batch(
            [{"to": "b", "text": f"hello {i}", "message_id": f"{where}-{i}"} for i in range(5)]
            + [{"to": "nobody", "text": "x"}]
        )
        assert (sent.sent, sent.failed) == (5, 1)
        assert sent.results[5].error is not None
        assert sent.results[5].error.code == "unknown_recipient"
        got = await b.receive(limit=10)
        assert sorted(m.text for m in got) == [f"hello {i}" for i in range(5)]
        acked = await b.ack_batch([m.message_id for m in got] + ["gone"])
        assert (acked.acked, acked.not_held, acked.invalid) == (5, 1, 0)
        me = await b.me()
        assert (me.team, me.name, me.admin) == ("t", "b", False)
