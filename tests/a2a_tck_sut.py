"""A hub whose member ``tck/sut`` answers the A2A conformance kit's scenarios.

For ``make a2a-tck`` only (never part of ``backchannel serve``): it serves the A2A
endpoints alone, lets ``tck/sut`` be called without a token (the kit sends none), and
runs an in-process agent for that member that follows the kit's scenario conventions:
the A2A ``messageId`` prefix (``tck-<scenario>-...``) picks what the member answers,
through the ordinary ``agent_stop`` with ``data["a2a"]``.

    python -m tests.a2a_tck_sut --port 9999 --home DIR   # then the kit against
    http://127.0.0.1:9999/a2a/tck/sut
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from backchannel.hub import Hub, HubMiddleware
from backchannel.interfaces.a2a import mount_a2a
from backchannel.stores.sqlite import SqliteStore
from backchannel.types import MemberKind, Message, SendResult

TEAM, MEMBER, CALLER = "tck", "sut", "user"
STREAM_TIMEOUT = 10.0  # the kit's default streaming timeout, seconds

_FILE = {"raw": base64.b64encode(b"file content").decode(), "filename": "output.txt"}
_FILE["mediaType"] = "text/plain"

# scenario -> (closing text, data["a2a"], seconds the member works first)
SCENARIOS: dict[str, tuple[str, dict[str, Any], float]] = {
    "complete-task": ("Hello from TCK", {"artifacts": []}, 0),
    "artifact-text": ("Generated text content", {}, 0),
    "artifact-file": ("", {"artifacts": [{"parts": [_FILE], "name": "output.txt"}]}, 0),
    "artifact-file-url": (
        "",
        {
            "artifacts": [
                {
                    "parts": [
                        {
                            "url": "https://example.com/output.txt",
                            "filename": "output.txt",
                            "mediaType": "text/plain",
                        }
                    ]
                }
            ]
        },
        0,
    ),
    "artifact-data": (
        "",
        {"artifacts": [{"parts": [{"data": {"key": "value", "count": 42}}]}]},
        0,
    ),
    "message-response": ("Direct message response", {"reply": "message"}, 0),
    "input-required": ("Please provide more input", {"state": "input-required"}, 0),
    "reject-task": ("rejected", {"state": "rejected"}, 0),
    "stream-001": ("Stream hello from TCK", {}, 0),
    "stream-002": ("", {"artifacts": []}, 0),
    "stream-003": ("Stream task lifecycle", {}, 0),
    "stream-ordering-001": ("Ordered output", {}, 0),
    "stream-artifact-text": ("Streamed text content", {}, 0),
    "stream-artifact-file": ("", {"artifacts": [{"parts": [_FILE], "name": "output.txt"}]}, 0),
    "stream-artifact-chunked": (
        "",
        {
            "artifacts": [
                {"artifact_id": "chunked", "parts": [{"text": "chunk-1 "}]},
                {
                    "artifact_id": "chunked",
                    "parts": [{"text": "chunk-2"}],
                    "append": True,
                    "last_chunk": True,
                },
            ]
        },
        0,
    ),
}


def scenario(message_id: str) -> tuple[str, dict[str, Any], float]:
    if message_id.startswith("test-resubscribe-message-id"):
        return "Resubscribed and done", {}, 2 * STREAM_TIMEOUT
    if message_id.startswith("tck-"):
        # longest name first: "artifact-file-url" before "artifact-file"
        for name in sorted(SCENARIOS, key=len, reverse=True):
            if message_id.startswith(f"tck-{name}"):
                return SCENARIOS[name]
    return "Hello from TCK", {}, 0


async def answer(hub: Hub, sid: str) -> None:
    got = await hub.receive(TEAM, MEMBER, session=sid, pinned_only=True)
    for m in got:
        a2a = m.message.meta.get("a2a") or {}
        text, data, delay = scenario(str(a2a.get("message_id", "")))
        await hub.report_event(TEAM, MEMBER, sid, "turn_start", m.message.text)
        await hub.ack(TEAM, MEMBER, [m.message.message_id])
        if delay:
            await asyncio.sleep(delay)
        await hub.report_event(TEAM, MEMBER, sid, "agent_stop", text, {"a2a": data})


class Inputs(HubMiddleware):
    """The member's runtime is told of each input for one of its sessions as it is sent
    (no scanning of sessions, which grow by one per task)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()

    def after_send(self, hub: Hub, message: Message, result: SendResult) -> None:
        for r in result.recipients:
            if r.member == MEMBER and message.team == TEAM and r.session:
                self.queue.put_nowait(r.session)


async def agent(hub: Hub, inputs: Inputs) -> None:
    """The member's runtime: each task session's input, answered as its scenario says."""
    working: set[asyncio.Task[None]] = set()
    try:
        while True:
            sid = await inputs.queue.get()
            job = asyncio.create_task(answer(hub, sid))
            working.add(job)
            job.add_done_callback(working.discard)
    finally:
        for job in list(working):
            job.cancel()


def make_app(home: Path) -> FastAPI:
    home.mkdir(parents=True, exist_ok=True)
    inputs = Inputs()
    hub = Hub(SqliteStore(str(home / "tck.db")), middleware=[inputs])

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await hub.start()
        teams = {t.name for t in await hub.list_teams()}
        if TEAM not in teams:
            await hub.create_team(TEAM)
            await hub.add_member(TEAM, MEMBER, MemberKind.LLM)
        runner = asyncio.create_task(agent(hub, inputs))
        try:
            yield
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
            await hub.close()

    app = FastAPI(lifespan=lifespan)
    app.state.hub = hub
    if not mount_a2a(app, open_member=(TEAM, MEMBER, CALLER)):
        sys.exit("a2a-sdk is not installed: pip install 'backchannel[a2a]'")
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--home", type=Path, required=True)
    args = parser.parse_args()
    app = make_app(args.home)
    print(json.dumps({"url": f"http://127.0.0.1:{args.port}/a2a/{TEAM}/{MEMBER}"}), flush=True)
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=3
    )


if __name__ == "__main__":
    main()
