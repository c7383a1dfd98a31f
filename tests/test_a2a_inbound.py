"""Members as A2A agents: the official a2a-sdk client against a real ``serve``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a.client")

from a2a.client import A2ACardResolver, Client, ClientConfig, create_client
from a2a.client.errors import A2AClientError, AgentCardResolutionError
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError
from google.protobuf.json_format import ParseDict

from backchannel.a2a_peer import task_chain
from backchannel.core.budget import ChainRef
from backchannel.testing import eventually
from tests.conftest import Server, start_server

Answer = Callable[[dict[str, Any]], tuple[str, dict[str, Any]] | None]


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[Server, dict[str, str]]]:
    srv = start_server(tmp_path / "home")
    try:
        tokens = srv.team("t", "lead", "worker")
        tokens["other"] = srv.team("u", "other")["other"]
        yield srv, tokens
    finally:
        srv.stop()


class Worker:
    """Plays the member's runtime over the HTTP API: takes each task message from its
    sessions and answers it with ``agent_stop`` as ``answer`` says (None: no answer)."""

    def __init__(self, url: str, token: str, answer: Answer) -> None:
        self.http = httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        self.answer = answer
        self.seen: list[dict[str, Any]] = []

    async def run(self) -> None:
        while True:
            sessions = (await self.http.get("/v1/sessions")).json()["sessions"]
            for s in sessions:
                if s["state"] != "idle" or not s["session_id"].startswith("a2a-"):
                    continue
                sid = s["session_id"]
                r = await self.http.get("/v1/inbox", params={"session": sid, "limit": 5})
                if r.status_code != 200:
                    continue  # ended meanwhile (a canceled task)
                for m in r.json()["messages"]:
                    await self.http.post("/v1/inbox/ack", json={"message_ids": [m["message_id"]]})
                    self.seen.append(m)
                    reply = self.answer(m)
                    if reply is None:
                        continue
                    await self.http.post(
                        f"/v1/sessions/{sid}/events", json={"kind": "turn_start", "text": m["text"]}
                    )
                    text, data = reply
                    await self.http.post(
                        f"/v1/sessions/{sid}/events",
                        json={"kind": "agent_stop", "text": text, "data": data},
                    )
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def playing(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await worker.http.aclose()


@contextlib.asynccontextmanager
async def a2a_client(
    url: str, token: str, *, streaming: bool, binding: str = "JSONRPC"
) -> AsyncIterator[Client]:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    try:
        config = ClientConfig(
            streaming=streaming,
            httpx_client=http,
            supported_protocol_bindings=[binding],
            use_client_preference=True,
        )
        client = await create_client(url, config)
        yield client
        await client.close()
    finally:
        await http.aclose()


def _json_headers(token: str) -> dict[str, str]:
    """A JSON request of A2A 1.0 with ``token``."""
    return {
        "Authorization": f"Bearer {token}",
        "content-type": "application/json",
        "A2A-Version": "1.0",
    }


def _message(text: str, task_id: str = "") -> Message:
    return Message(
        role=Role.ROLE_USER,
        message_id=f"m-{text.split()[0]}-{uuid.uuid4().hex[:12]}",  # unique, as A2A asks
        task_id=task_id,
        parts=[Part(text=text)],
    )


def _answers(m: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    text = m["text"]
    if text.startswith("hold"):
        return None
    if text.startswith("trip"):
        return "Which city?", {"a2a": {"state": "input-required"}}
    if text.startswith("Paris"):
        return "Booked: Paris", {}
    if text.startswith("chat"):
        return "hi back", {"a2a": {"reply": "message"}}
    return f"done: {text} (from {m['from']})", {}


async def _final_task(client: Client, request: SendMessageRequest) -> Task:
    last: Task | None = None
    async for event in client.send_message(request):
        if event.HasField("task"):
            last = event.task
    assert last is not None
    return last


async def test_send_stream_get_list_input_required(hub: tuple[Server, dict[str, str]]) -> None:
    srv, tokens = hub
    url = f"{srv.url}/a2a/t/worker"
    async with playing(Worker(srv.url, tokens["worker"], _answers)) as worker:
        async with a2a_client(url, tokens["lead"], streaming=False) as client:
            async with httpx.AsyncClient(
                headers={"Authorization": f"Bearer {tokens['lead']}"}
            ) as http:
                card = await A2ACardResolver(http, url).get_agent_card()
            assert [i.protocol_binding for i in card.supported_interfaces] == [
                "JSONRPC",
                "HTTP+JSON",
            ]
            assert "bearer" in card.security_schemes
            task = await _final_task(client, SendMessageRequest(message=_message("count files")))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert task.artifacts[0].parts[0].text == "done: count files (from lead)"
            assert worker.seen[-1]["from"] == "lead"  # the sender is the token's member
            assert worker.seen[-1]["kind"] == "delegation"
            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert got.artifacts[0].parts[0].text == "done: count files (from lead)"

            # the member asks back; the follow-up goes to the same session
            asked = await _final_task(client, SendMessageRequest(message=_message("trip to")))
            assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert asked.status.message.parts[0].text == "Which city?"
            booked = await _final_task(
                client, SendMessageRequest(message=_message("Paris", task_id=asked.id))
            )
            assert booked.id == asked.id
            assert booked.status.state == TaskState.TASK_STATE_COMPLETED
            assert booked.artifacts[-1].parts[0].text == "Booked: Paris"
            listed = await client.list_tasks(ListTasksRequest())
            assert {t.id for t in listed.tasks} == {task.id, asked.id}

        async with a2a_client(url, tokens["lead"], streaming=True) as client:
            states = []
            texts = []
            async for event in client.send_message(
                SendMessageRequest(message=_message("stream this"))
            ):
                if event.HasField("task"):
                    states.append(event.task.status.state)
                elif event.HasField("status_update"):
                    states.append(event.status_update.status.state)
                elif event.HasField("artifact_update"):
                    texts.append(event.artifact_update.artifact.parts[0].text)
            assert texts == ["done: stream this (from lead)"]
            assert states[0] == TaskState.TASK_STATE_SUBMITTED
            assert TaskState.TASK_STATE_WORKING in states
            assert states[-1] == TaskState.TASK_STATE_COMPLETED

        # the same over HTTP+JSON, streamed
        async with a2a_client(url, tokens["lead"], streaming=True, binding="HTTP+JSON") as client:
            rest = await _final_task(client, SendMessageRequest(message=_message("over rest")))
            got = await client.get_task(GetTaskRequest(id=rest.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert got.artifacts[0].parts[0].text == "done: over rest (from lead)"

        # tasks are the caller's own: another member of the team does not see them
        async with a2a_client(url, tokens["user"], streaming=False) as client:
            assert list((await client.list_tasks(ListTasksRequest())).tasks) == []
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=task.id))


@pytest.mark.slow
async def test_cancel_then_durable_after_restart(
    hub: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    srv, tokens = hub
    url = f"{srv.url}/a2a/t/worker"
    async with playing(Worker(srv.url, tokens["worker"], _answers)) as worker:
        async with a2a_client(url, tokens["lead"], streaming=False) as client:
            request = SendMessageRequest(
                message=_message("hold on"),
                configuration=SendMessageConfiguration(return_immediately=True),
            )
            pending = await _final_task(client, request)
            assert pending.status.state in (
                TaskState.TASK_STATE_SUBMITTED,
                TaskState.TASK_STATE_WORKING,
            )
            await eventually(
                lambda: any(m["text"] == "hold on" for m in worker.seen),
                what="the member to have the task",
            )
            canceled = await client.cancel_task(CancelTaskRequest(id=pending.id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            done = await _final_task(client, SendMessageRequest(message=_message("keep me")))
            # two more that are still open when the hub goes down
            to_cancel = await _final_task(
                client,
                SendMessageRequest(
                    message=_message("hold three"),
                    configuration=SendMessageConfiguration(return_immediately=True),
                ),
            )
            open_task = await _final_task(
                client,
                SendMessageRequest(
                    message=_message("hold again"),
                    configuration=SendMessageConfiguration(return_immediately=True),
                ),
            )
        async with httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {tokens['worker']}"}
        ) as w:
            sessions = (await w.get("/v1/sessions")).json()["sessions"]
            states = {s["session_id"]: s["state"] for s in sessions}
            assert states[f"a2a-{pending.id}"] == "terminated"

    # a restart keeps the tasks; an answer given meanwhile completes the open one
    srv.stop()
    again = start_server(srv.home, srv.store_url)
    try:
        url = f"{again.url}/a2a/t/worker"
        async with a2a_client(url, tokens["lead"], streaming=True) as client:
            got = await client.get_task(GetTaskRequest(id=done.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert got.artifacts[0].parts[0].text == "done: keep me (from lead)"
            got = await client.get_task(GetTaskRequest(id=pending.id))
            assert got.status.state == TaskState.TASK_STATE_CANCELED
            canceled = await client.cancel_task(CancelTaskRequest(id=to_cancel.id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            async with httpx.AsyncClient(
                base_url=again.url, headers={"Authorization": f"Bearer {tokens['worker']}"}
            ) as w:
                sessions = (await w.get("/v1/sessions", params={"member": "worker"})).json()
                states = {s["session_id"]: s["state"] for s in sessions["sessions"]}
                assert states[f"a2a-{to_cancel.id}"] == "terminated"

            events: list[Any] = []

            async def follow() -> None:
                async for event in client.subscribe(SubscribeToTaskRequest(id=open_task.id)):
                    events.append(event)

            follower = asyncio.create_task(follow())
            # resubscribing yields the stored task first
            await eventually(lambda: events, what="the stored task from the resubscription")

            def late(m: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
                return ("finally", {}) if m["text"] == "hold again" else None

            sid = f"a2a-{open_task.id}"
            async with httpx.AsyncClient(
                base_url=again.url, headers={"Authorization": f"Bearer {tokens['worker']}"}
            ) as w:
                await w.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start"})
                await w.post(
                    f"/v1/sessions/{sid}/events", json={"kind": "agent_stop", "text": "finally"}
                )
            del late
            await asyncio.wait_for(follower, 30)
            last = events[-1]
            assert last.status_update.status.state == TaskState.TASK_STATE_COMPLETED
            got = await client.get_task(GetTaskRequest(id=open_task.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert got.artifacts[-1].parts[0].text == "finally"
    finally:
        again.stop()


async def test_bad_token_and_other_teams(hub: tuple[Server, dict[str, str]]) -> None:
    srv, tokens = hub
    with pytest.raises(AgentCardResolutionError):
        async with a2a_client(f"{srv.url}/a2a/t/worker", "bc_not-a-token", streaming=False):
            pass
    async with httpx.AsyncClient(base_url=srv.url) as http:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {
                "message": {"messageId": "x", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
            },
        }
        r = await http.post("/a2a/t/worker/", json=body)
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = await http.post(
            "/a2a/t/worker/", json=body, headers={"Authorization": "Bearer bc_wrong"}
        )
        assert r.status_code == 401
        lead = {"Authorization": f"Bearer {tokens['lead']}"}
        card = "/.well-known/agent-card.json"
        other = await http.get(f"/a2a/u/other{card}", headers=lead)
        unknown = await http.get(f"/a2a/t/nobody{card}", headers=lead)
        assert (other.status_code, unknown.status_code) == (404, 404)
        assert other.json()["error"]["code"] == unknown.json()["error"]["code"] == "not_found"
        r = await http.post("/a2a/u/other/", json=body, headers=lead)
        assert r.status_code == 404
        # the other team's member reaches its own teammate, not ours
        mine = await http.get(
            f"/a2a/u/other{card}", headers={"Authorization": f"Bearer {tokens['other']}"}
        )
        assert mine.status_code == 200
    with pytest.raises(AgentCardResolutionError):
        async with a2a_client(f"{srv.url}/a2a/u/other", tokens["lead"], streaming=False):
            pass
    # a member attached through hooks cannot be started in a session: said at once
    with srv.client() as admin:
        admin.post("/v1/teams/t/members", json={"name": "cc", "kind": "claude-code"})
    async with a2a_client(f"{srv.url}/a2a/t/cc", tokens["lead"], streaming=False) as client:
        task = await _final_task(client, SendMessageRequest(message=_message("hello")))
        assert task.status.state == TaskState.TASK_STATE_FAILED
        assert "attached through hooks" in task.status.message.parts[0].text


async def _task_in_hand(w: httpx.AsyncClient) -> str:
    """The session of the A2A task the member (client ``w``) was just given; its message
    is taken, so the next call finds the next task."""

    async def find() -> str | None:
        for s in (await w.get("/v1/sessions", params={"member": "worker"})).json()["sessions"]:
            sid = s["session_id"]
            if not sid.startswith("a2a-") or s["state"] != "idle":
                continue
            r = await w.get("/v1/inbox", params={"session": sid, "limit": 5})
            if r.status_code == 200 and (got := r.json()["messages"]):
                await w.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got]})
                return str(sid)
        return None

    return await eventually(find, what="the member to have the task")


async def test_a_request_that_waits_past_a_rotation_hands_over_nothing(
    hub: tuple[Server, dict[str, str]],
) -> None:
    # the token is checked when the request comes; a stream or a blocking send that
    # waits for the member's answer past a rotation of the caller's token (or its
    # removal) must not hand the answer to the holder of the old token
    srv, tokens = hub
    url = f"{srv.url}/a2a/t/worker"
    token = tokens["lead"]
    secret = "the answer for lead only"

    def rotate() -> str:
        with srv.client() as admin:
            r = admin.post("/v1/teams/t/members/lead/token")
            assert r.status_code == 200, r.text
            return str(r.json()["token"])

    async def answer(w: httpx.AsyncClient, sid: str) -> None:
        await w.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start"})
        await w.post(f"/v1/sessions/{sid}/events", json={"kind": "agent_stop", "text": secret})

    async with httpx.AsyncClient(
        base_url=srv.url, headers={"Authorization": f"Bearer {tokens['worker']}"}, timeout=30
    ) as w:
        for binding in ("JSONRPC", "HTTP+JSON"):
            events: list[str] = []
            async with a2a_client(url, token, streaming=True, binding=binding) as client:

                async def follow(client: Client = client, events: list[str] = events) -> None:
                    request = SendMessageRequest(message=_message("hold it"))
                    async for event in client.send_message(request):
                        events.append(str(event))

                stream = asyncio.create_task(follow())
                sid = await _task_in_hand(w)
                token = rotate()
                await answer(w, sid)
                # the stream ends with an error event that says why, or, not begun yet
                # when the rotation ends it, is answered 401 (the SDK's client shows the
                # status, not the body)
                with pytest.raises(A2AClientError, match=r"rotated|401"):
                    await asyncio.wait_for(stream, 30)
            assert not [e for e in events if secret in e], (binding, events)

        # a blocking send (no stream) that waited is refused as the token is: 401
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            body = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "SendMessage",
                "params": {
                    "message": {"messageId": "m-b", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
                },
            }
            blocking = asyncio.create_task(
                http.post("/a2a/t/worker/", json=body, headers=_json_headers(token))
            )
            sid = await _task_in_hand(w)
            token = rotate()
            await answer(w, sid)
            r = await asyncio.wait_for(blocking, 30)
            assert r.status_code == 401, r.text
            assert secret not in r.text
            assert r.headers["www-authenticate"].startswith("Bearer")
            # the new token reads the task as before (the send was answered 401 at the
            # rotation, before the answer: the task records it as it comes)

            async def three_tasks() -> bool:
                listed = await http.post(
                    "/a2a/t/worker/",
                    json={"jsonrpc": "2.0", "id": 8, "method": "ListTasks", "params": {}},
                    headers=_json_headers(token),
                )
                assert listed.status_code == 200, listed.text
                return len(listed.json()["result"]["tasks"]) == 3

            await eventually(three_tasks, what="the blocking send's task to be listed")


@pytest.mark.parametrize("how", ["rotate", "remove member"])
async def test_a_request_that_waits_ends_at_once_when_its_token_is_revoked(
    hub: tuple[Server, dict[str, str]], how: str
) -> None:
    # a blocking send, and a stream, whose caller's token is rotated (or its member
    # removed) while the member has not answered end then with the auth error, not at
    # the answer (which may never come) or the client's deadline
    srv, tokens = hub

    def revoke() -> None:
        with srv.client() as admin:
            r = (
                admin.post("/v1/teams/t/members/lead/token")
                if how == "rotate"
                else admin.delete("/v1/teams/t/members/lead")
            )
            assert r.status_code == 200, r.text

    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "SendMessage",
        "params": {"message": {"messageId": "m-w", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
    }
    async with (
        httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {tokens['worker']}"}, timeout=30
        ) as w,
        httpx.AsyncClient(base_url=srv.url, timeout=60) as http,
    ):
        blocking = asyncio.create_task(
            http.post("/a2a/t/worker/", json=body, headers=_json_headers(tokens["lead"]))
        )
        await _task_in_hand(w)  # the send waits for the member's answer
        revoke()
        # nobody answers: before, the send waited on (for its answer or the deadline)
        r = await asyncio.wait_for(blocking, 10)
        assert r.status_code == 401, r.text
        assert "rotated or its member removed" in r.text
        assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e400"])
async def test_a_number_json_cannot_carry_is_refused_before_a_task_starts(
    hub: tuple[Server, dict[str, str]], number: str
) -> None:
    # the protobuf JSON parser takes these in data parts and metadata; the hub cannot
    # store or show them, so the request is refused as invalid params, not a 500
    srv, tokens = hub
    headers = _json_headers(tokens["lead"])
    data = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"data": {"n": "N"}}]}
    meta = {
        "messageId": "m-2",
        "role": "ROLE_USER",
        "parts": [{"text": "hi"}],
        "metadata": {"n": "N"},
    }
    async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=30) as http:
        for message in (data, meta):
            for path in ("message:send", "message:stream"):
                raw = json.dumps({"message": message}).replace('"N"', number)
                r = await http.post(f"/a2a/t/worker/{path}", content=raw)
                assert r.status_code == 400, r.text
                assert "NaN, Infinity or a number too large" in r.json()["error"]["message"]
            for method in ("SendMessage", "SendStreamingMessage"):
                rpc = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": message}}
                r = await http.post(
                    "/a2a/t/worker/", content=json.dumps(rpc).replace('"N"', number)
                )
                assert r.status_code == 200, r.text
                # a JSON-RPC body is parsed as strict JSON first: none of these is JSON
                assert r.json()["error"]["code"] == -32700, r.text
    with srv.client(tokens["worker"]) as worker:
        assert worker.get("/v1/sessions").json()["sessions"] == []  # no task was started


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" * 100_000, id="depth-100000"),
        pytest.param(
            b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": '
            + b"[" * 5000
            + b"]" * 5000
            + b"}",
            id="deep-params",
        ),
        pytest.param(
            b'{"jsonrpc": "2.0", "id": 1' + b"0" * 5000 + b', "method": "GetTask"}',
            id="id-5000-digits",
        ),
    ],
)
async def test_json_rpc_bodies_no_parser_takes_are_parse_errors(
    hub: tuple[Server, dict[str, str]], raw: bytes
) -> None:
    # JSON-RPC's parse error, as for any other bad JSON: not an internal error with a
    # traceback in the hub's log for every such request
    srv, tokens = hub
    headers = _json_headers(tokens["lead"])
    async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=30) as http:
        r = await http.post("/a2a/t/worker/", content=raw)
        assert r.status_code == 200, r.text
        assert r.json()["error"]["code"] == -32700, r.text
        assert r.json()["id"] is None
        ok = await http.post(
            "/a2a/t/worker/",
            json={"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "nope"}},
        )
        assert ok.json()["error"]["code"] == -32001, ok.text  # parsed, and not found
    assert "Traceback" not in (srv.home / "serve.log").read_text()


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        pytest.param([{"text": "x" * 300_000}], "over the 262144-byte limit", id="one-part"),
        pytest.param([{"text": "y" * 100_000}] * 3, "over the 262144-byte limit", id="parts"),
        pytest.param([{"text": "a\x00b"}], "NUL character", id="nul"),
    ],
)
async def test_a_message_the_member_could_not_be_sent_is_invalid_params_before_a_task_starts(
    hub: tuple[Server, dict[str, str]], parts: list[dict[str, Any]], why: str
) -> None:
    """A message whose text the hub would refuse to hand the member (over the hub's text
    limit, or holding a NUL) is an invalid-params error naming why, on both bindings and
    whether or not the client asked for the task at once: no task is kept (with the
    whole oversized message in its history), no session opened."""
    srv, tokens = hub
    headers = _json_headers(tokens["lead"])
    async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=30) as http:
        for n, method in enumerate(("SendMessage", "SendStreamingMessage")):
            for at_once in (False, True):
                message = {"messageId": f"m-{n}-{at_once}", "role": "ROLE_USER", "parts": parts}
                params = {"message": message, "configuration": {"returnImmediately": at_once}}
                rpc = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
                r = await http.post("/a2a/t/worker/", json=rpc)
                body = (
                    r.text.removeprefix("data: ").strip()
                    if "stream" in r.headers.get("content-type", "")
                    else r.text
                )
                error = json.loads(body)["error"]
                assert error["code"] == -32602, (method, at_once, error)
                assert why in error["message"], error
                assert error["message"].startswith("message.parts: "), error
        r = await http.post("/a2a/t/worker/message:send", json={"message": message})
        assert r.status_code == 400, r.text
        assert why in r.json()["error"]["message"], r.text
        listed = await http.get("/a2a/t/worker/tasks")
        assert listed.status_code == 200, listed.text
        assert listed.json().get("tasks", []) == [], listed.text
    with srv.client(tokens["worker"]) as worker:
        assert worker.get("/v1/sessions").json()["sessions"] == []  # no task was started


async def test_a_message_sent_again_reaches_the_member_once(
    hub: tuple[Server, dict[str, str]],
) -> None:
    """Another hub's outbox whose answer to a send was lost (a timeout, a cut
    connection) sends the same message (its ``messageId`` and all it holds, its chain
    among it) again: the member is handed it once, and every send of it answers with the
    one task, on both bindings, streaming or not, or with the one Message its member
    answered. Another caller's message of the same id, another message under the same
    id, and a message from a client that is no hub (no chain named) are messages of their
    own."""
    srv, tokens = hub
    with srv.client() as admin:
        made = admin.post("/v1/teams/t/members", json={"name": "other_t"})
        tokens["other_t"] = made.json()["token"]
    chain = {"backchannel.chain": {"id": "msg_chain_1", "hop": 1}}
    message = {"messageId": "dlg_once", "role": "ROLE_USER", "parts": [{"text": "once only"}]}
    message["metadata"] = chain
    params = {"message": message, "configuration": {"returnImmediately": True}}
    task_ids = set()
    async with (
        playing(Worker(srv.url, tokens["worker"], _answers)) as worker,
        httpx.AsyncClient(
            base_url=srv.url, headers=_json_headers(tokens["lead"]), timeout=30
        ) as http,
    ):
        for n in range(3):
            rpc = {"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": params}
            r = await http.post("/a2a/t/worker/", json=rpc)
            task_ids.add(r.json()["result"]["task"]["id"])
        r = await http.post("/a2a/t/worker/message:send", json=params)
        assert r.status_code == 200, r.text
        task_ids.add(r.json()["task"]["id"])
        rpc = {"jsonrpc": "2.0", "id": 9, "method": "SendStreamingMessage", "params": params}
        async with http.stream("POST", "/a2a/t/worker/", json=rpc) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    first = json.loads(line.removeprefix("data: "))
                    break
        task_ids.add(first["result"]["task"]["id"])
        assert len(task_ids) == 1, task_ids

        async def taken() -> bool:
            return len(worker.seen) >= 1

        await eventually(taken, what="the task", within=10)
        async with a2a_client(f"{srv.url}/a2a/t/worker", tokens["other_t"], streaming=False) as c:
            other = await _final_task(c, SendMessageRequest(message=ParseDict(message, Message())))
        assert other.id not in task_ids
        # another message under the same messageId is a message of its own
        changed = {**message, "parts": [{"text": "once more, with feeling"}]}
        rpc = {"jsonrpc": "2.0", "id": 10, "method": "SendMessage", "params": {"message": changed}}
        again = (await http.post("/a2a/t/worker/", json=rpc)).json()["result"]["task"]
        assert again["id"] not in task_ids | {other.id}
        # a send answered with a Message is answered with it again, not with a task
        chat = {"messageId": "dlg_chat", "role": "ROLE_USER", "parts": [{"text": "chat"}]}
        chat["metadata"] = chain
        for n in (11, 12):
            rpc = {"jsonrpc": "2.0", "id": n, "method": "SendMessage",
                   "params": {"message": chat}}  # fmt: skip
            answer = (await http.post("/a2a/t/worker/", json=rpc)).json()["result"]
            assert answer["message"]["parts"] == [{"text": "hi back"}], answer
        # a client that names no chain is no hub: its messages are each their own
        plain = {"messageId": "kit_1", "role": "ROLE_USER", "parts": [{"text": "twice"}]}
        plain_tasks = set()
        for n in (13, 14):
            rpc = {"jsonrpc": "2.0", "id": n, "method": "SendMessage",
                   "params": {**params, "message": plain}}  # fmt: skip
            plain_tasks.add(
                (await http.post("/a2a/t/worker/", json=rpc)).json()["result"]["task"]["id"]
            )
        assert len(plain_tasks) == 2

        async def all_seen() -> bool:
            return len(worker.seen) >= 6

        await eventually(all_seen, what="every task's input", within=10)
    seen = sorted((m["from"], m["text"]) for m in worker.seen)
    assert seen == [
        ("lead", "chat"),
        ("lead", "once more, with feeling"),
        ("lead", "once only"),
        ("lead", "twice"),
        ("lead", "twice"),
        ("other_t", "once only"),
    ], seen


# -- the conversation chain another hub names ----------------------------------------------


def _in_chain(text: str, chain: Any) -> Message:
    """A message that names the conversation chain it goes on in, as a hub sends it."""
    m = _message(text)
    m.metadata.update({"backchannel.chain": chain})
    return m


async def test_a_message_goes_on_in_the_chain_it_names_and_a_forged_hop_resets_nothing(
    hub: tuple[Server, dict[str, str]],
) -> None:
    """A task another hub sends names its chain in the message's metadata: the member's
    task goes on in it at that hop. A chain spent on this hub stays spent: a message that
    names it again at a smaller hop goes on at the budget, where the member's turn can send
    nothing further in it; one past the budget is refused like any send (the task is
    rejected with the refusal, which names the way out) and the member is handed
    nothing."""
    srv, tokens = hub
    url = f"{srv.url}/a2a/t/worker"
    budget = 32  # the team's chain_budget (the default)
    async with (
        playing(Worker(srv.url, tokens["worker"], _answers)) as worker,
        a2a_client(url, tokens["lead"], streaming=False) as client,
    ):
        task = await _final_task(
            client, SendMessageRequest(message=_in_chain("go on", {"id": "c-1", "hop": 5}))
        )
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert (worker.seen[-1]["chain_id"], worker.seen[-1]["hop"]) == ("c-1", 5)
        # the answer names the chain it goes on in, one hop further, for the caller's hub
        assert task_chain(task) == ChainRef("c-1", 6)
        # the task at the budget is taken, and spends the chain on this hub
        spend = _in_chain("last hop", {"id": "c-spent", "hop": budget})
        task = await _final_task(client, SendMessageRequest(message=spend))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert (worker.seen[-1]["chain_id"], worker.seen[-1]["hop"]) == ("c-spent", budget)
        forged = _in_chain("start over", {"id": "c-spent", "hop": 0})
        task = await _final_task(client, SendMessageRequest(message=forged))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert (worker.seen[-1]["chain_id"], worker.seen[-1]["hop"]) == ("c-spent", budget)
        sid = f"a2a-{task.id}"
        with srv.client(tokens["worker"]) as w:
            sent = w.post("/v1/messages", json={"to": "lead", "text": "on", "from_session": sid})
            assert sent.status_code == 429, sent.text
            assert sent.json()["error"]["key"] == "chain:c-spent"
        seen = len(worker.seen)
        past = _in_chain("past it", {"id": "c-spent", "hop": budget + 1})
        task = await _final_task(client, SendMessageRequest(message=past))
        # A2A's answer for a message the agent will not take: rejected, not failed, with
        # the budget named and the way out
        assert task.status.state == TaskState.TASK_STATE_REJECTED
        why = task.status.message.parts[0].text
        assert why.startswith("not sent: this conversation chain (c-spent)"), why
        assert "chain_budget" in why, why
        assert "backchannel budget extend t chain:c-spent --by N" in why, why
        assert "/v1/teams/t/budgets/extend" in why, why
        assert len(worker.seen) == seen, "the member was handed nothing"
        # a message that names no chain starts one of its own, as before
        task = await _final_task(client, SendMessageRequest(message=_message("fresh start")))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert worker.seen[-1]["chain_id"] not in ("c-1", "c-spent")


async def test_a_malformed_chain_in_the_metadata_is_invalid_params_naming_the_field(
    hub: tuple[Server, dict[str, str]],
) -> None:
    srv, tokens = hub
    key = 'metadata["backchannel.chain"]'
    bad = [
        ({"id": "", "hop": 1}, f"{key}.id"),
        ({"id": "has space", "hop": 1}, f"{key}.id"),
        ({"id": "x" * 129, "hop": 1}, f"{key}.id"),
        ({"id": 12, "hop": 1}, f"{key}.id"),
        ({"hop": 1}, f"{key}.id"),
        ({"id": "c1", "hop": -1}, f"{key}.hop"),
        ({"id": "c1", "hop": 1_000_001}, f"{key}.hop"),
        ({"id": "c1", "hop": 2**70}, f"{key}.hop"),
        ({"id": "c1", "hop": 1.5}, f"{key}.hop"),
        ({"id": "c1", "hop": "3"}, f"{key}.hop"),
        ({"id": "c1", "hop": True}, f"{key}.hop"),
        ({"id": "c1"}, f"{key}.hop"),
        ("c1", key),
        ([["c1", 1]], key),
    ]
    headers = _json_headers(tokens["lead"])
    async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=30) as http:
        for chain, field in bad:
            message = {
                "messageId": "m-1",
                "role": "ROLE_USER",
                "parts": [{"text": "hi"}],
                "metadata": {"backchannel.chain": chain},
            }
            rpc = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {"message": message},
            }
            r = await http.post("/a2a/t/worker/", json=rpc)
            assert r.status_code == 200, r.text
            error = r.json()["error"]
            assert error["code"] == -32602, (chain, error)
            assert error["message"].startswith(f"message.{field} "), (chain, error)
            r = await http.post("/a2a/t/worker/message:send", json={"message": message})
            assert r.status_code == 400, (chain, r.text)
            assert r.json()["error"]["message"].startswith(f"message.{field} "), (chain, r.text)
    with srv.client(tokens["worker"]) as worker:
        assert worker.get("/v1/sessions").json()["sessions"] == []  # no task was started


async def test_a_follow_up_sent_again_is_answered_as_its_first_send_was(
    hub: tuple[Server, dict[str, str]],
) -> None:
    """Another hub's outbox that lost the answer to a follow-up (a message naming the
    task, its chain among its metadata) sends it again: the repeat is answered with the
    task as the follow-up left it (asking back again, or completed), at once, on both
    bindings, streaming or not, and the member was handed the follow-up once. It neither
    waits for another answer nor is refused for the task having ended."""
    srv, tokens = hub
    chain = {"backchannel.chain": {"id": "msg_chain_f", "hop": 1}}
    first = {"messageId": "dlg_f1", "role": "ROLE_USER", "parts": [{"text": "trip to?"}]}
    first["metadata"] = chain
    async with (
        playing(Worker(srv.url, tokens["worker"], _answers)) as worker,
        httpx.AsyncClient(
            base_url=srv.url, headers=_json_headers(tokens["lead"]), timeout=15
        ) as http,
    ):
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": first}}
        asked = (await http.post("/a2a/t/worker/", json=rpc)).json()["result"]["task"]
        assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", asked
        for n, (text, state) in enumerate(
            [("trip further?", "TASK_STATE_INPUT_REQUIRED"), ("Paris", "TASK_STATE_COMPLETED")]
        ):
            follow = {
                "messageId": f"dlg_f2{n}",
                "role": "ROLE_USER",
                "taskId": asked["id"],
                "contextId": asked["contextId"],
                "parts": [{"text": text}],
                "metadata": chain,
            }
            answers = []
            for rpc_id in (2, 3):
                rpc = {"jsonrpc": "2.0", "id": rpc_id, "method": "SendMessage",
                       "params": {"message": follow}}  # fmt: skip
                r = await http.post("/a2a/t/worker/", json=rpc)
                assert "result" in r.json(), r.text
                answers.append(r.json()["result"]["task"])
            r = await http.post("/a2a/t/worker/message:send", json={"message": follow})
            assert r.status_code == 200, r.text
            answers.append(r.json()["task"])
            rpc = {"jsonrpc": "2.0", "id": 4, "method": "SendStreamingMessage",
                   "params": {"message": follow}}  # fmt: skip
            async with http.stream("POST", "/a2a/t/worker/", json=rpc) as stream:
                events = [
                    json.loads(line.removeprefix("data: "))
                    async for line in stream.aiter_lines()
                    if line.startswith("data: ")
                ]
            assert "result" in events[-1], events
            answers.append(events[-1]["result"]["task"])
            for task in answers:
                assert task["id"] == asked["id"]
                assert task["status"]["state"] == state, (text, task)
        assert task["artifacts"][-1]["parts"] == [{"text": "Booked: Paris"}], task
    assert [m["text"] for m in worker.seen] == ["trip to?", "trip further?", "Paris"]


@pytest.mark.parametrize(
    ("raw", "lone"),
    [
        pytest.param(b'"\\ud83d"', "\\ud83d", id="high-at-the-end"),
        pytest.param(b'"\\ud83dx"', "\\ud83d", id="high-then-text"),
        pytest.param(b'"ok \\ud83d\\ude00 \\ude00"', "\\ude00", id="low-after-a-pair"),
        pytest.param(b'"\\\\ud800 \\uDBFF\\u0041"', "\\uDBFF", id="after-an-escaped-backslash"),
    ],
)
async def test_a_lone_surrogate_in_the_body_is_a_parse_error_naming_it(
    hub: tuple[Server, dict[str, str]], raw: bytes, lone: str
) -> None:
    """Half an emoji pair escaped in a string is JSON-RPC's parse error that names the
    lone surrogate and the way out, as the hub's strict JSON rules say it (not the
    parser's "unexpected end of hex escape"); the HTTP API says the same."""
    srv, tokens = hub
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": ' + raw + b"}}"
    headers = _json_headers(tokens["lead"])
    async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=30) as http:
        r = await http.post("/a2a/t/worker/", content=body)
        error = r.json()["error"]
        assert error["code"] == -32700, error
        why = error["message"]
        assert f"lone UTF-16 surrogate {lone}" in why, why
        assert "send" in why and "U+FFFD" in why, why
        assert "hex escape" not in why, why
        api = await http.post("/v1/messages", content=b'{"to": "worker", "text": ' + raw + b"}")
        assert api.status_code == 422, api.text
        assert f"lone UTF-16 surrogate {lone}" in api.json()["error"]["message"], api.text


@pytest.mark.parametrize(
    ("rpc", "code"),
    [
        pytest.param({"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                      "params": {"id": "x", "historyLength": 1.5}}, -32602, id="half-history"),
        pytest.param({"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                      "params": {"id": "x", "historyLength": 2**31}}, -32602, id="huge-history"),
        pytest.param({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                      "params": {"message": {"role": "ROLE_NOPE"}, "x": []}}, -32602, id="enum"),
        pytest.param({"jsonrpc": "1.0", "id": 1, "method": "GetTask"}, -32600, id="jsonrpc-1.0"),
        pytest.param({"id": 1, "params": {}}, -32600, id="no-method"),
    ],
)  # fmt: skip
async def test_requests_the_sdk_cannot_read_are_answered_without_a_traceback_in_the_log(
    hub: tuple[Server, dict[str, str]], rpc: dict[str, Any], code: int
) -> None:
    """A request whose params (or envelope) the SDK cannot read is JSON-RPC's error for
    it, and the hub's log says so in a line: a client that sends such requests cannot
    fill the log with the SDK's tracebacks (it logs each with ``logger.exception``)."""
    srv, tokens = hub
    headers = _json_headers(tokens["lead"])
    async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=30) as http:
        r = await http.post("/a2a/t/worker/", json=rpc)
        assert r.json()["error"]["code"] == code, r.text
    log = (srv.home / "serve.log").read_text()
    assert "Traceback" not in log, log
    assert "request" in log.lower()  # the line that says what was refused


async def test_cancel_of_a_finished_task_is_task_not_cancelable_409_on_http_json(
    hub: tuple[Server, dict[str, str]],
) -> None:
    """``tasks/cancel`` of a task that has ended is ``TaskNotCancelableError``: -32002 on
    JSON-RPC, and on HTTP+JSON the status spec 1.0 section 5.4 maps it to, 409 Conflict
    (the SDK answers 400), with the AIP-193 body's code the same; the task stays as it
    ended."""
    srv, tokens = hub
    async with (
        playing(Worker(srv.url, tokens["worker"], _answers)),
        httpx.AsyncClient(
            base_url=srv.url, headers=_json_headers(tokens["lead"]), timeout=30
        ) as http,
    ):
        m = {"messageId": "m-done", "role": "ROLE_USER", "parts": [{"text": "finish it"}]}
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": m}}
        task = (await http.post("/a2a/t/worker/", json=rpc)).json()["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
        r = await http.post(f"/a2a/t/worker/tasks/{task['id']}:cancel", json={})
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert (error["code"], error["status"]) == (409, "FAILED_PRECONDITION"), error
        assert error["details"][0]["reason"] == "TASK_NOT_CANCELABLE", error
        rpc = {"jsonrpc": "2.0", "id": 2, "method": "CancelTask", "params": {"id": task["id"]}}
        r = await http.post("/a2a/t/worker/", json=rpc)
        assert r.json()["error"]["code"] == -32002, r.text
        # other errors keep their status
        r = await http.post("/a2a/t/worker/tasks/nope:cancel", json={})
        assert r.status_code == 404, r.text
        r = await http.get(f"/a2a/t/worker/tasks/{task['id']}", params={"historyLength": "-1"})
        assert r.status_code == 400, r.text
        got = (await http.get(f"/a2a/t/worker/tasks/{task['id']}")).json()
        assert got["status"]["state"] == "TASK_STATE_COMPLETED", got
