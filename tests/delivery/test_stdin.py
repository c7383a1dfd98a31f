"""The stdin adapter: a tiny Python "agent" the dispatcher starts and feeds stream-json."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from backchannel.delivery.base import AdapterContext, PermanentDeliveryError
from backchannel.delivery.stdin import StdinAdapter, StdinAgent, StdinClosed, stream_json_line
from backchannel.hub import Hub
from backchannel.testing import eventually
from backchannel.types import SessionState
from tests.delivery.conftest_adapters import dispatching, running_hub, wait_state

# Appends each stdin line to OUT. "exit N": exit after N lines. "close": close stdin at
# once, say so in OUT, and linger until killed.
AGENT = r"""
import os, sys, time
out, mode = sys.argv[1], sys.argv[2]
if mode == "close":
    os.close(0)
    with open(out, "a") as f:
        f.write("closed\n")
    time.sleep(60)
    sys.exit(0)
limit = int(sys.argv[3]) if mode == "exit" else None
n = 0
for line in sys.stdin:
    with open(out, "a") as f:
        f.write(line)
    n += 1
    if limit is not None and n >= limit:
        sys.exit(3)
"""


def _setting(tmp_path: Path, *mode: str, session: str | None = None) -> dict[str, Any]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    setting: dict[str, Any] = {
        "type": "stdin",
        "command": [sys.executable, str(script), str(tmp_path / "out.jsonl"), *mode],
    }
    if session:
        setting["session"] = session
    return setting


async def _lines(path: Path, n: int) -> list[str]:
    async def check() -> list[str] | None:
        lines = path.read_text().splitlines() if path.exists() else []  # noqa: ASYNC240
        return lines if len(lines) >= n else None

    return list(await eventually(check, what=f"{n} line(s) in {path.name}"))


async def _session_state(hub: Hub, sid: str, state: SessionState) -> Any:
    async def check() -> Any:
        s = await hub.get_session("t", sid)
        return s if s.state is state else None

    return await eventually(check, what=f"session {sid} to be {state.value}")


async def test_each_message_is_one_stream_json_user_line(tmp_path: Path) -> None:
    setting = {**_setting(tmp_path, "run", session="lead-1"), "stdout": str(tmp_path / "log")}
    async with running_hub() as hub:
        await hub.add_member("t", "lead", "claude-code", delivery=setting)
        async with dispatching(hub) as d:
            first = await hub.send(
                "t", "user", "lead", 'plan the work\n"quoted" ünïcode', link=False
            )
            second = await hub.send("t", "user", "lead", "second", link=False)
            lines = await _lines(tmp_path / "out.jsonl", 2)
            await wait_state(hub, "t", first.message_id, "acked")
            await wait_state(hub, "t", second.message_id, "acked")
            assert d.status()[0].session == "lead-1"
        # a hub shutdown ends the agent but not its session: the next start resumes it
        assert (await hub.get_session("t", "lead-1")).state is SessionState.IDLE
    assert [json.loads(line) for line in lines] == [
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {"type": "text", "text": '[From user] plan the work\n"quoted" ünïcode'}
                ],
            },
        },
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [{"type": "text", "text": "[From user] second"}],
            },
        },
    ]
    assert stat.S_IMODE(os.stat(tmp_path / "log").st_mode) == 0o600  # the agent's output
    assert lines[0].encode() + b"\n" == stream_json_line(
        '[From user] plan the work\n"quoted" ünïcode'
    )


async def test_agent_exit_terminates_the_session(tmp_path: Path) -> None:
    async with running_hub() as hub:
        await hub.add_member(
            "t", "lead", delivery=_setting(tmp_path, "exit", "1", session="lead-1")
        )
        async with dispatching(hub) as d:
            sent = await hub.send("t", "user", "lead", "only one", link=False)
            await _lines(tmp_path / "out.jsonl", 1)
            await wait_state(hub, "t", sent.message_id, "acked")
            await _session_state(hub, "lead-1", SessionState.TERMINATED)
            data = await hub.get_session_data("t", "lead-1")
            assert "exited with code 3" in json.dumps(data)

            async def stopped() -> bool:
                return d.status()[0].state == "stopped"

            await eventually(stopped, what="the worker to stop")
            assert "terminated" in (d.status()[0].stopped_reason or "")


async def test_closed_stdin_terminates_the_session(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    async with running_hub() as hub:
        await hub.add_member("t", "lead", delivery=_setting(tmp_path, "close"))
        async with dispatching(hub) as d:
            await _lines(out, 1)  # the agent closed its stdin and is still running
            sid = d.status()[0].session
            assert sid is not None and sid.startswith("lead-")
            await _session_state(hub, sid, SessionState.TERMINATED)
            data = await hub.get_session_data("t", sid)
            assert "closed its stdin" in json.dumps(data)

            async def stopped() -> bool:
                return d.status()[0].state == "stopped"

            await eventually(stopped, what="the worker to stop")
            # nobody serves the member now: a new message waits, it is not lost
            sent = await hub.send("t", "user", "lead", "are you there?", link=False)
            assert (await hub.message_status("t", sent.message_id)).state.value == "queued"
    assert out.read_text() == "closed\n"


async def test_write_to_a_closed_stdin_dead_letters_the_message(tmp_path: Path) -> None:
    """The race the watcher cannot win: the write itself finds the stdin closed."""
    async with running_hub() as hub:
        await hub.add_member("t", "lead", delivery=_setting(tmp_path, "close"))
        adapter = StdinAdapter(AdapterContext(hub, "t", "lead", _setting(tmp_path, "close")))
        adapter._closing = True  # no watcher: this test plays the race by hand
        await adapter.start()
        try:
            await _lines(tmp_path / "out.jsonl", 1)
            await hub.send("t", "user", "lead", "hello", link=False)
            (item,) = await hub.receive("t", "lead", session=adapter.session)
            with pytest.raises(PermanentDeliveryError, match="stdin"):
                await adapter.deliver(item)
            assert adapter.session is not None
            s = await hub.get_session("t", adapter.session)
            assert s.state is SessionState.TERMINATED
        finally:
            await adapter.close()


async def test_unstartable_command_is_dead_lettered(tmp_path: Path) -> None:
    async with running_hub() as hub:
        setting = {"type": "stdin", "command": [str(tmp_path / "no-such-agent")]}
        await hub.add_member("t", "lead", delivery=setting)
        async with dispatching(hub):
            sent = await hub.send("t", "user", "lead", "hello", link=False)
            st = await wait_state(hub, "t", sent.message_id, "dead")
    assert "cannot start" in (st.deliveries[0].dead_reason or "")


async def test_stdin_agent_owns_the_process(tmp_path: Path) -> None:
    setting = _setting(tmp_path, "exit", "1")
    agent = StdinAgent(setting["command"])
    await agent.start()
    await agent.send(stream_json_line("hi"))
    assert await agent.wait() == 3
    with pytest.raises(StdinClosed, match="exited with code 3"):
        await agent.send(stream_json_line("again"))
    assert await agent.close() == 3


async def test_command_may_be_a_string(tmp_path: Path) -> None:
    async with running_hub() as hub:
        adapter = StdinAdapter(
            AdapterContext(
                hub,
                "t",
                "lead",
                {"type": "stdin", "command": "claude -p --input-format stream-json"},
            )
        )
        assert adapter.agent.command == ["claude", "-p", "--input-format", "stream-json"]
