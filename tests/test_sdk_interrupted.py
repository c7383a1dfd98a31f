"""The SDK's receivers left early: a loop over ``inbox()`` that stops after the first
message of a batch leaves the rest of the batch to come back at once, not at the end of
their lease (over HTTP, against a real ``backchannel serve``)."""

from __future__ import annotations

import contextlib

from backchannel import connect, connect_sync
from tests.conftest import Server


def _send(srv: Server, token: str, *texts: str) -> list[str]:
    ids = []
    with srv.client(token) as c:
        for text in texts:
            r = c.post("/v1/messages", json={"to": "worker", "text": text})
            assert r.status_code == 201, r.text
            ids.append(r.json()["message_id"])
    return ids


async def test_breaking_out_of_inbox_gives_the_rest_of_its_batch_back(server: Server) -> None:
    tokens = server.team("alpha", "lead", "worker")
    sent = _send(server, tokens["lead"], "one", "two", "three")
    async with connect(server.url, tokens["worker"]) as c:
        async with contextlib.aclosing(c.inbox(wait=5, batch=10)) as stream:
            async for first in stream:
                await first.ack()
                break
        assert first.message_id == sent[0]
        back = await c.receive(limit=10, wait=0)  # no wait: a leased one would be missing
        assert [m.message_id for m in back] == sent[1:]


def test_breaking_out_of_the_sync_inbox_gives_the_rest_of_its_batch_back(
    server: Server,
) -> None:
    tokens = server.team("alpha", "lead", "worker")
    sent = _send(server, tokens["lead"], "one", "two", "three")
    with connect_sync(server.url, tokens["worker"]) as c:
        for first in c.inbox(wait=5, batch=10):
            first.ack()
            break
        assert first.message_id == sent[0]
        back = c.receive(limit=10, wait=0)
        assert [m.message_id for m in back] == sent[1:]
