"""A2A callers that hang up mid-call, send a message again, resubscribe, or race a
cancel, against a real ``serve`` over real sockets: the member is handed each message
once, the task keeps one story, and no caller waits forever."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

pytest.importorskip("a2a.client")

from backchannel.testing import eventually
from tests.conftest import Server, start_server
from tests.test_a2a_inbound import Worker, _answers, _json_headers, playing


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, dict[str, str]]]:
    srv = start_server(tmp_path / "home")
    try:
        yield srv, srv.team("t", "lead", "worker")
    finally:
        srv.stop()


@contextlib.asynccontextmanager
async def lead_and_worker(
    srv: Server, tokens: dict[str, str]
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Two clients of ``srv``: the A2A caller (``lead``'s token, JSON-RPC headers) and
    the member ``worker`` answering its tasks over the hub's own API."""
    async with (
        httpx.AsyncClient(
            base_url=srv.url, headers=_json_headers(tokens["lead"]), timeout=60
        ) as http,
        httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {tokens['worker']}"}
        ) as member,
    ):
        yield http, member


@contextlib.asynccontextmanager
async def _raw_post(srv: Server, token: str, path: str, rpc: dict[str, Any]) -> AsyncIterator[None]:
    """POST ``rpc`` to ``path`` over a socket of its own, closed on leaving without
    reading a byte of the answer: a caller whose connection is cut mid-call."""
    where = urlsplit(srv.url)
    body = json.dumps(rpc).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"A2A-Version: 1.0\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    _, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        writer.write(head + body)
        await writer.drain()
        yield
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _answer(http: httpx.AsyncClient, sid: str, text: str) -> None:
    """The member answers in its task session ``sid`` (a turn that ends with ``text``)."""
    r = await http.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start"})
    r.raise_for_status()
    r = await http.post(f"/v1/sessions/{sid}/events", json={"kind": "agent_stop", "text": text})
    r.raise_for_status()


async def _task_sessions(http: httpx.AsyncClient) -> set[str]:
    sessions = (await http.get("/v1/sessions")).json()["sessions"]
    return {s["session_id"] for s in sessions if s["session_id"].startswith("a2a-")}


def _rpc(n: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "method": method, "params": params}


def _hub_message(mid: str, text: str) -> dict[str, Any]:
    """A message as another hub's outbox sends it (naming its chain)."""
    chain = {"backchannel.chain": {"id": "msg_chain_cut", "hop": 1}}
    return {"messageId": mid, "role": "ROLE_USER", "parts": [{"text": text}], "metadata": chain}


async def test_a_send_cut_off_before_its_answer_and_sent_again_reaches_the_member_once(
    served: tuple[Server, dict[str, str]],
) -> None:
    """A hub's outbox whose ``SendMessage`` lost its connection before the answer sends
    the message again with the same ``messageId``: once the member has it and works on
    it, while the first send still waits for the answer (and after it hung up), or at
    once, both sends in flight together. The member is handed it once, and every send
    that is answered is answered with the one task the member completes, never a second
    task or a failed one."""
    srv, tokens = served
    async with lead_and_worker(srv, tokens) as (http, member):
        # cut while the member works; the answer comes while the repeat waits for it
        rpc = _rpc(1, "SendMessage", {"message": _hub_message("dlg_cut_1", "hold cut")})
        async with _raw_post(srv, tokens["lead"], "/a2a/t/worker/", rpc):

            async def opened() -> set[str]:
                return await _task_sessions(member)

            (sid,) = await eventually(opened, what="the task's session", within=20)
        repeat = asyncio.create_task(http.post("/a2a/t/worker/", json=rpc))
        await _answer(member, sid, "held and done")
        answer = (await asyncio.wait_for(repeat, 60)).json()
        task = answer["result"]["task"]
        assert sid == f"a2a-{task['id']}", answer
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", answer
        assert task["artifacts"][0]["parts"][0]["text"] == "held and done", answer

        # both sends in flight at once, the first cut off, many times
        async with playing(Worker(srv.url, tokens["worker"], _answers)) as worker:
            rounds = 6
            answers = []
            for n in range(rounds):
                rpc = _rpc(
                    n, "SendMessage", {"message": _hub_message(f"dlg_race_{n}", f"race {n}")}
                )
                async with _raw_post(srv, tokens["lead"], "/a2a/t/worker/", rpc):
                    answers.append((await http.post("/a2a/t/worker/", json=rpc)).json())
            for n, answer in enumerate(answers):
                assert "result" in answer, (n, answer)
                task = answer["result"]["task"]
                assert task["status"]["state"] == "TASK_STATE_COMPLETED", (
                    n,
                    task["status"].get("message"),
                )
                assert task["artifacts"][0]["parts"][0]["text"] == f"done: race {n} (from lead)"
            listed = (await http.post("/a2a/t/worker/", json=_rpc(99, "ListTasks", {}))).json()
            ids = sorted(t["id"] for t in listed["result"]["tasks"])
            assert ids == sorted({a["result"]["task"]["id"] for a in answers} | {sid[4:]}), listed
        seen = sorted(m["text"] for m in worker.seen)
        assert seen == ["hold cut", *(f"race {n}" for n in range(rounds))], seen


async def test_a_cancel_racing_the_answer_ends_the_task_once_and_the_caller_hears_that_end(
    served: tuple[Server, dict[str, str]],
) -> None:
    """``CancelTask`` sent while the member's answer comes in, many times over: the task
    ends in one state. The blocking send, the cancel and ``GetTask`` all tell that one
    story: canceled (the cancel answered with the canceled task, the send too, no
    artifact), or completed (the cancel refused with ``TaskNotCancelableError``, -32002,
    the send answered with the answer). The member is handed each message once."""
    srv, tokens = served
    rounds = 12
    outcomes = []
    async with lead_and_worker(srv, tokens) as (http, member):
        known: set[str] = set()
        for n in range(rounds):
            message = {"messageId": f"m-race-{n}", "role": "ROLE_USER",
                       "parts": [{"text": f"hold race {n}"}]}  # fmt: skip
            send = asyncio.create_task(
                http.post("/a2a/t/worker/", json=_rpc(n, "SendMessage", {"message": message}))
            )

            async def new_session() -> set[str]:
                return await _task_sessions(member) - known

            (sid,) = await eventually(new_session, what="the task's session", within=20)
            known.add(sid)
            task_id = sid.removeprefix("a2a-")
            # the member shows work first (the task is shown), then the race
            r = await member.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start"})
            r.raise_for_status()
            r = await member.post(
                f"/v1/sessions/{sid}/events", json={"kind": "thought", "text": "on it"}
            )
            r.raise_for_status()

            async def shown(task_id: str = task_id) -> bool:
                got = await http.post("/a2a/t/worker/", json=_rpc(0, "GetTask", {"id": task_id}))
                return "result" in got.json()

            await eventually(shown, what="the task to be shown", within=20)
            answer, cancel = await asyncio.gather(
                member.post(
                    f"/v1/sessions/{sid}/events",
                    json={"kind": "agent_stop", "text": f"answer {n}"},
                ),
                http.post("/a2a/t/worker/", json=_rpc(n, "CancelTask", {"id": task_id})),
            )
            sent = (await asyncio.wait_for(send, 60)).json()
            got = (
                await http.post("/a2a/t/worker/", json=_rpc(n, "GetTask", {"id": task_id}))
            ).json()["result"]
            final = got["status"]["state"]
            canceled = cancel.json()
            story = (n, final, canceled, sent, answer.status_code)
            assert final in ("TASK_STATE_CANCELED", "TASK_STATE_COMPLETED"), story
            assert sent["result"]["task"]["status"]["state"] == final, story
            if final == "TASK_STATE_CANCELED":
                assert canceled["result"]["status"]["state"] == final, story
                assert not got.get("artifacts"), story
                assert not sent["result"]["task"].get("artifacts"), story
                if answer.is_success:  # taken before the session ended: kept in its transcript
                    transcript = await member.get(f"/v1/sessions/{sid}/transcript")
                    assert f"answer {n}" in transcript.text, story
            else:
                assert "error" in canceled, (canceled.get("result", {}).get("status"), story)
                assert canceled["error"]["code"] == -32002, story
                assert [a["parts"] for a in got["artifacts"]] == [[{"text": f"answer {n}"}]]
            outcomes.append(final)
    assert len(outcomes) == rounds


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC results of an SSE stream, in order (an error raises)."""
    async for line in lines:
        if line.startswith("data: "):
            payload = json.loads(line.removeprefix("data: "))
            assert "result" in payload, payload
            yield payload["result"]


def _state(event: dict[str, Any]) -> str | None:
    if "task" in event:
        return str(event["task"]["status"]["state"])
    if "statusUpdate" in event:
        return str(event["statusUpdate"]["status"]["state"])
    return None


async def test_a_stream_whose_caller_hangs_up_goes_on_and_a_resubscription_sees_the_rest_once(
    served: tuple[Server, dict[str, str]],
) -> None:
    """A caller of ``SendStreamingMessage`` that hangs up mid-stream loses nothing: the
    task goes on, the member's answer is kept, and ``SubscribeToTask`` (from a caller
    that came back before the answer) gives the task as it is now, then the rest, the
    answer's artifact and the final state each once, agreeing with ``GetTask``."""
    srv, tokens = served
    async with lead_and_worker(srv, tokens) as (http, member):
        message = {"messageId": "m-stream-cut", "role": "ROLE_USER", "parts": [{"text": "hold"}]}
        rpc = _rpc(1, "SendStreamingMessage", {"message": message})

        async def first_event() -> dict[str, Any]:
            async with http.stream("POST", "/a2a/t/worker/", json=rpc) as stream:
                async for event in _events(stream.aiter_lines()):
                    return event  # the caller hangs up after the first event
            raise AssertionError("the stream ended without an event")

        streaming = asyncio.create_task(first_event())

        async def opened() -> set[str]:
            return await _task_sessions(member)

        (sid,) = await eventually(opened, what="the task's session", within=20)
        # the member shows work: the task appears on the stream
        r = await member.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start"})
        r.raise_for_status()
        r = await member.post(f"/v1/sessions/{sid}/events", json={"kind": "thought", "text": "hm"})
        r.raise_for_status()
        first = await asyncio.wait_for(streaming, 30)
        task_id = first["task"]["id"]
        assert sid == f"a2a-{task_id}"

        async def working() -> bool:
            got = await http.post("/a2a/t/worker/", json=_rpc(2, "GetTask", {"id": task_id}))
            return bool(got.json()["result"]["status"]["state"] == "TASK_STATE_WORKING")

        await eventually(working, what="the task to be working", within=20)
        seen: list[dict[str, Any]] = []
        subscribed = asyncio.Event()

        async def follow() -> None:
            sub = _rpc(3, "SubscribeToTask", {"id": task_id})
            async with http.stream("POST", "/a2a/t/worker/", json=sub) as stream:
                async for event in _events(stream.aiter_lines()):
                    seen.append(event)
                    subscribed.set()

        follower = asyncio.create_task(follow())
        await asyncio.wait_for(subscribed.wait(), 30)
        r = await member.post(
            f"/v1/sessions/{sid}/events", json={"kind": "agent_stop", "text": "kept"}
        )
        r.raise_for_status()
        await asyncio.wait_for(follower, 30)
        got = await http.post("/a2a/t/worker/", json=_rpc(4, "GetTask", {"id": task_id}))
        task = got.json()["result"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert [a["parts"] for a in task["artifacts"]] == [[{"text": "kept"}]], task
    assert "task" in seen[0], seen
    assert seen[0]["task"]["status"]["state"] == "TASK_STATE_WORKING", seen
    # what the subscription showed adds up to what GetTask says, nothing twice
    artifacts = list(seen[0]["task"].get("artifacts", []))
    artifacts += [e["artifactUpdate"]["artifact"] for e in seen if "artifactUpdate" in e]
    assert artifacts == task["artifacts"], seen
    states = [_state(e) for e in seen]
    assert states.count("TASK_STATE_COMPLETED") == 1, states
    assert states[-1] == "TASK_STATE_COMPLETED", states


async def test_resubscribing_to_a_finished_task_is_an_error_at_once(
    served: tuple[Server, dict[str, str]],
) -> None:
    """``SubscribeToTask`` of a task that has ended answers at once with the error spec
    1.0 gives it (``UnsupportedOperationError``, -32004; on HTTP+JSON its status), on both
    bindings, and never waits for events that cannot come."""
    srv, tokens = served
    async with (
        playing(Worker(srv.url, tokens["worker"], _answers)),
        httpx.AsyncClient(
            base_url=srv.url, headers=_json_headers(tokens["lead"]), timeout=20
        ) as http,
    ):
        message = {"messageId": "m-fin", "role": "ROLE_USER", "parts": [{"text": "finish"}]}
        got = await http.post("/a2a/t/worker/", json=_rpc(1, "SendMessage", {"message": message}))
        task = got.json()["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
        sub = _rpc(2, "SubscribeToTask", {"id": task["id"]})
        async with http.stream("POST", "/a2a/t/worker/", json=sub) as stream:
            body = (await stream.aread()).decode()
        # the error before any event: a JSON-RPC error response, or a stream's one event
        data = [x.removeprefix("data: ") for x in body.splitlines() if x.startswith("data: ")]
        assert json.loads(data[0] if data else body)["error"]["code"] == -32004, body
        async with http.stream("GET", f"/a2a/t/worker/tasks/{task['id']}:subscribe") as stream:
            rest = (await stream.aread()).decode()
            status = stream.status_code
        error = json.loads(rest)["error"]
        assert status == 400, (status, rest)
        assert error["details"][0]["reason"] == "UNSUPPORTED_OPERATION", error
        assert "terminal state: TASK_STATE_COMPLETED" in error["message"], error
