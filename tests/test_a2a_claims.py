"""An A2A message sent again by another hub's outbox (the same ``messageId``, naming its
chain) to a hub other than the one the first send reached, both on one store, or to a
hub restarted (``kill -9``) while the member works: real ``serve`` processes on one
SQLite file and on the PostgreSQL the harness starts. The member is handed the message
once, and the repeat is answered with the one task the first send started."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a.client")

from backchannel.testing import eventually
from tests.conftest import Server, start_server
from tests.stores.test_postgres_hubs import start_hubs, stop_all
from tests.test_a2a_hangups import (
    _answer,
    _events,
    _hub_message,
    _raw_post,
    _rpc,
    _state,
    _task_sessions,
    lead_and_worker,
)
from tests.test_a2a_inbound import Worker, _answers, _json_headers, playing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'shared.db'}"
    new_url: Callable[[], str] = request.getfixturevalue("new_postgres_url")
    return new_url()


async def _taken_once(member: httpx.AsyncClient, sid: str, text: str = "hold across hubs") -> None:
    """The member takes the task's message from its session, and nothing more is there."""
    got = (await member.get("/v1/inbox", params={"session": sid})).json()["messages"]
    assert [m["text"] for m in got] == [text], got
    r = await member.post("/v1/inbox/ack", json={"message_ids": [got[0]["message_id"]]})
    r.raise_for_status()


async def _working_on(
    http: httpx.AsyncClient, task_id: str, repeat: asyncio.Task[httpx.Response]
) -> dict[str, Any]:
    """The task as ``GetTask`` shows it through ``http``'s hub, once it is working; the
    repeat (a blocking send) must not have been answered before the member answers."""

    async def working() -> dict[str, Any] | None:
        if repeat.done():
            pytest.fail(
                f"the repeat was answered before the member answered: {repeat.result().text}"
            )
        got = (await http.post("/a2a/t/worker/", json=_rpc(7, "GetTask", {"id": task_id}))).json()
        task = got.get("result")
        return task if task and task["status"]["state"] == "TASK_STATE_WORKING" else None

    return await eventually(working, what="the repeat's task, working", within=30)


async def _repeat_answered(
    srv: Server, tokens: dict[str, str], sid: str, rpc: dict[str, Any]
) -> None:
    """Send ``rpc`` again to ``srv`` while the member works on its task ``sid``: once the
    repeat shows the task working, the member answers, and the repeat is answered with
    the task completed with that answer."""
    async with lead_and_worker(srv, tokens) as (http, member):
        repeat = asyncio.create_task(http.post("/a2a/t/worker/", json=rpc))
        try:
            task = await _working_on(http, sid.removeprefix("a2a-"), repeat)
            await _taken_once(member, sid)
            await _answer(member, sid, "held and done")
            answer = (await asyncio.wait_for(repeat, 60)).json()
        finally:
            repeat.cancel()
        got = answer["result"]["task"]
        assert got["id"] == task["id"] == sid.removeprefix("a2a-"), answer
        assert got["status"]["state"] == "TASK_STATE_COMPLETED", answer
        assert got["artifacts"][0]["parts"][0]["text"] == "held and done", answer
        assert await _task_sessions(member) == {sid}
        left = (await member.get("/v1/inbox", params={"session": sid})).json()["messages"]
        assert left == [], left


async def test_a_send_cut_off_on_one_hub_and_sent_again_to_another_gets_its_one_task(
    tmp_path: Path, store_url: str
) -> None:
    """Hub A takes the send and hands the member the message; the caller's connection is
    cut before the answer and its retry lands on hub B (a load balancer), before the
    member has shown any work (no task saved yet). B answers with A's task, as the
    member completes it: no second task, no failed one, the message handed over once."""
    a, b = hubs = start_hubs(tmp_path, store_url, 2)
    try:
        tokens = a.team("t", "lead", "worker")
        rpc = _rpc(1, "SendMessage", {"message": _hub_message("dlg_hubs_1", "hold across hubs")})
        async with (
            httpx.AsyncClient(
                base_url=b.url, headers={"Authorization": f"Bearer {tokens['worker']}"}
            ) as member,
            _raw_post(a, tokens["lead"], "/a2a/t/worker/", rpc),
        ):

            async def opened() -> set[str]:
                return await _task_sessions(member)

            (sid,) = await eventually(opened, what="the task's session", within=20)
        await _repeat_answered(b, tokens, sid, rpc)
    finally:
        stop_all(hubs)


async def test_a_send_sent_again_to_a_hub_killed_and_restarted_mid_task_gets_its_one_task(
    tmp_path: Path, store_url: str
) -> None:
    """The hub that took the send is killed (``kill -9``) while the member works and
    before any task was saved; the caller's retry reaches it once it is back. The
    repeat is answered from the store with the task the first send started."""
    (hub,) = start_hubs(tmp_path, store_url, 1)
    again: Server | None = None
    try:
        tokens = hub.team("t", "lead", "worker")
        rpc = _rpc(1, "SendMessage", {"message": _hub_message("dlg_kill_1", "hold across hubs")})
        async with (
            httpx.AsyncClient(
                base_url=hub.url, headers={"Authorization": f"Bearer {tokens['worker']}"}
            ) as member,
            _raw_post(hub, tokens["lead"], "/a2a/t/worker/", rpc),
        ):

            async def opened() -> set[str]:
                return await _task_sessions(member)

            (sid,) = await eventually(opened, what="the task's session", within=20)
            hub.kill()
        again = start_server(hub.home, store_url)
        await _repeat_answered(again, tokens, sid, rpc)
    finally:
        stop_all([hub, *([again] if again is not None else [])])


async def test_the_same_send_to_two_hubs_at_once_is_one_task(
    tmp_path: Path, store_url: str
) -> None:
    """Another hub's outbox timed out and sent again while the first send was still
    starting, each landing on a different hub on the store: both sends are answered with
    the one task the member completes, and the member is handed each message once."""
    a, b = hubs = start_hubs(tmp_path, store_url, 2)
    try:
        tokens = a.team("t", "lead", "worker")
        async with (
            httpx.AsyncClient(
                base_url=a.url, headers=_json_headers(tokens["lead"]), timeout=60
            ) as on_a,
            httpx.AsyncClient(
                base_url=b.url, headers=_json_headers(tokens["lead"]), timeout=60
            ) as on_b,
            playing(Worker(b.url, tokens["worker"], _answers)) as worker,
        ):
            rounds = 5
            ids: list[str] = []
            for n in range(rounds):
                rpc = _rpc(n, "SendMessage", {"message": _hub_message(f"dlg_two_{n}", f"two {n}")})
                answers = [
                    r.json()
                    for r in await asyncio.gather(
                        on_a.post("/a2a/t/worker/", json=rpc), on_b.post("/a2a/t/worker/", json=rpc)
                    )
                ]
                assert all("result" in x for x in answers), (n, answers)
                tasks = [x["result"]["task"] for x in answers]
                assert tasks[0]["id"] == tasks[1]["id"], (n, answers)
                for task in tasks:
                    assert task["status"]["state"] == "TASK_STATE_COMPLETED", (n, task)
                    assert task["artifacts"][0]["parts"][0]["text"] == f"done: two {n} (from lead)"
                ids.append(tasks[0]["id"])
            for http in (on_a, on_b):  # one task a round, whichever hub lists them
                listed = (await http.post("/a2a/t/worker/", json=_rpc(9, "ListTasks", {}))).json()
                assert sorted(t["id"] for t in listed["result"]["tasks"]) == sorted(ids), listed
        seen = sorted(m["text"] for m in worker.seen)
        assert seen == [f"two {n}" for n in range(rounds)], seen
    finally:
        stop_all(hubs)
    _no_tracebacks(hubs)


async def test_the_same_send_to_two_hubs_at_once_while_the_member_is_slow_is_one_task(
    tmp_path: Path, store_url: str
) -> None:
    """The race above with a member slower than the losing hub's patience: the hub
    whose send lost the claim writes the task down from the claim (working) before the
    member shows anything, and the winner shows the task only when the member answers.
    Both sends are answered with the one task completed, the member is handed the
    message once, and neither hub logs the task written down meanwhile as an error."""
    a, b = hubs = start_hubs(tmp_path, store_url, 2)
    try:
        tokens = a.team("t", "lead", "worker")
        rpc = _rpc(1, "SendMessage", {"message": _hub_message("dlg_slow_1", "hold slow")})
        async with (
            lead_and_worker(a, tokens) as (on_a, member),
            lead_and_worker(b, tokens) as (on_b, _),
        ):
            sends = [asyncio.create_task(h.post("/a2a/t/worker/", json=rpc)) for h in (on_a, on_b)]
            try:

                async def opened() -> set[str]:
                    return await _task_sessions(member)

                (sid,) = await eventually(opened, what="the task's session", within=20)
                # the task is saved (written down from its claim by the hub that lost
                # it) while the member has shown no work and both sends still wait
                await _working_on(on_a, sid.removeprefix("a2a-"), sends[0])
                assert not sends[1].done(), sends[1].result().text
                await _taken_once(member, sid, "hold slow")
                await _answer(member, sid, "slow and done")
                answers = [(await asyncio.wait_for(s, 60)).json() for s in sends]
            finally:
                for s in sends:
                    s.cancel()
            for answer in answers:
                got = answer["result"]["task"]
                assert got["id"] == sid.removeprefix("a2a-"), answers
                assert got["status"]["state"] == "TASK_STATE_COMPLETED", answers
                assert [a["parts"][0]["text"] for a in got["artifacts"]] == ["slow and done"]
            assert await _task_sessions(member) == {sid}
            for http in (on_a, on_b):  # one task on the store, whichever hub lists it
                listed = (await http.post("/a2a/t/worker/", json=_rpc(9, "ListTasks", {}))).json()
                assert [t["id"] for t in listed["result"]["tasks"]] == [sid[4:]], listed
    finally:
        stop_all(hubs)
    _no_tracebacks(hubs)


def _no_tracebacks(hubs: list[Server]) -> None:
    """The race is the expected end of a retry, answered right: no hub logged it as an
    error with a traceback (the A2A library's ``Execution failed``)."""
    for srv in hubs:
        log = (srv.home / "serve.log").read_text()
        assert "Traceback" not in log and " ERROR " not in log, log[-4000:]


async def test_the_same_streaming_send_to_two_hubs_at_once_is_one_task(
    tmp_path: Path, store_url: str
) -> None:
    """The streaming form of the race above (``SendStreamingMessage``): each stream shows
    the one task the member completes, its answer and its final state once."""
    a, b = hubs = start_hubs(tmp_path, store_url, 2)
    try:
        tokens = a.team("t", "lead", "worker")
        async with (
            httpx.AsyncClient(
                base_url=a.url, headers=_json_headers(tokens["lead"]), timeout=60
            ) as on_a,
            httpx.AsyncClient(
                base_url=b.url, headers=_json_headers(tokens["lead"]), timeout=60
            ) as on_b,
            playing(Worker(b.url, tokens["worker"], _answers)) as worker,
        ):

            async def stream(http: httpx.AsyncClient, rpc: dict[str, Any]) -> list[dict[str, Any]]:
                async with http.stream("POST", "/a2a/t/worker/", json=rpc) as answer:
                    return [e async for e in _events(answer.aiter_lines())]

            rounds = 3
            one: list[str] = []
            for n in range(rounds):
                message = _hub_message(f"dlg_stream_{n}", f"stream {n}")
                rpc = _rpc(n, "SendStreamingMessage", {"message": message})
                both = await asyncio.gather(stream(on_a, rpc), stream(on_b, rpc))
                ids = set()
                for events in both:
                    assert events, (n, both)
                    ids |= {
                        e["task"]["id"] if "task" in e else e[next(iter(e))]["taskId"]
                        for e in events
                    }
                    states = [_state(e) for e in events]
                    assert states.count("TASK_STATE_COMPLETED") == 1, (n, events)
                    texts = [
                        p["text"]
                        for e in events
                        for art in (
                            e["task"].get("artifacts", [])
                            if "task" in e
                            else [e["artifactUpdate"]["artifact"]]
                            if "artifactUpdate" in e
                            else []
                        )
                        for p in art["parts"]
                    ]
                    assert texts == [f"done: stream {n} (from lead)"], (n, events)
                assert len(ids) == 1, (n, both)
                one.extend(ids)
            for http in (on_a, on_b):  # one task a round, whichever hub lists them
                listed = (await http.post("/a2a/t/worker/", json=_rpc(9, "ListTasks", {}))).json()
                assert sorted(t["id"] for t in listed["result"]["tasks"]) == sorted(one), listed
        seen = sorted(m["text"] for m in worker.seen)
        assert seen == [f"stream {n}" for n in range(rounds)], seen
    finally:
        stop_all(hubs)
    _no_tracebacks(hubs)
