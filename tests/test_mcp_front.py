"""``backchannel mcp`` answers the handshake while the real server loads, exactly as the
real server would, and hands everything else over in order, each answer given once."""

from __future__ import annotations

import io
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backchannel.interfaces.mcp import wire_snapshot
from backchannel.interfaces.mcp_front import REPLAY_ID, WIRE, Front
from tests.conftest import BIN, Server, start_server
from tests.runtimes.agents import make_team


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("front") / "home")
    try:
        yield s
    finally:
        s.stop()


async def test_the_wire_file_is_what_the_server_answers() -> None:
    assert json.loads(WIRE.read_text()) == await wire_snapshot(), (
        "mcp_wire.json is stale: run `python -m backchannel.interfaces.mcp_front --write`"
    )


def _hello(version: str = "2025-06-18", id_: Any = 1) -> str:
    params = {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": "initialize", "params": params})


def test_the_front_answers_the_handshake_and_keeps_the_order() -> None:
    wire = json.loads(WIRE.read_text())
    out = io.BytesIO()
    front = Front(wire, out)
    call = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {}})
    later = json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
    initialized = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
    for line in (
        _hello(),
        initialized,
        json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        call,
        later,  # after a line that waits, everything waits: the order holds
    ):
        front.received(line)
    answers = [json.loads(x) for x in out.getvalue().splitlines()]
    assert answers == [
        {"jsonrpc": "2.0", "id": 1, "result": wire["initialize"]["2025-06-18"]},
        {"jsonrpc": "2.0", "id": 2, "result": wire["tools/list"]},
    ]
    passed: list[str | None] = []
    front.attach(passed.append)
    front.received("after")
    front.received(None)
    replay = json.loads(str(passed[0]))
    assert (replay["id"], replay["method"]) == (REPLAY_ID, "initialize")
    assert passed[1:] == [initialized, call, later, "after", None]


@pytest.mark.parametrize("odd", ["version", "client"])
def test_what_the_front_does_not_know_is_left_to_the_server(odd: str) -> None:
    out = io.BytesIO()
    front = Front(json.loads(WIRE.read_text()), out)
    hello = json.loads(_hello("2099-01-01" if odd == "version" else "2025-06-18"))
    if odd == "client":
        del hello["params"]["clientInfo"]["version"]  # the SDK refuses this one: let it
    front.received(json.dumps(hello))
    front.received(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
    assert out.getvalue() == b""
    passed: list[str | None] = []
    front.attach(passed.append)
    assert [json.loads(str(p))["id"] for p in passed] == [1, 2]


def _converse(srv: Server, token: str, lines: list[str], want: set[Any]) -> list[dict[str, Any]]:
    """Lines to a real ``backchannel mcp`` process; every answer it writes, until each id
    in ``want`` has one, then stdin closes and the process must exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    with subprocess.Popen(
        [str(BIN), "mcp"],
        env={**env, "BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": token},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            for line in lines:
                proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answers: list[dict[str, Any]] = []
            while not want <= {a.get("id") for a in answers}:
                line = proc.stdout.readline()
                assert line, f"the server stopped: {proc.stderr.read() if proc.stderr else ''}"
                answers.append(json.loads(line))
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0
            answers += [json.loads(x) for x in proc.stdout.read().splitlines()]
            return answers
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_real_process_answers_each_request_once(srv: Server) -> None:
    tokens = make_team(srv, "frontteam", "a:claude-code", "b")
    call = {"name": "send_message", "arguments": {"to": "b", "message": "hello through the front"}}
    answers = _converse(
        srv,
        tokens["a"],
        [
            _hello(),
            json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call}),
            json.dumps({"jsonrpc": "2.0", "id": 4, "method": "ping"}),
        ],
        want={1, 2, 3, 4},
    )
    ids = [a.get("id") for a in answers]
    assert sorted(ids, key=str) == [1, 2, 3, 4], answers  # once each, the replay unseen
    result = next(a for a in answers if a["id"] == 3)["result"]
    assert result.get("isError") is not True, result
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {tokens['b']}"}) as c:
        got = c.get("/v1/inbox").json()["messages"]
    assert [m["text"] for m in got] == ["hello through the front"]


def test_a_real_process_with_a_version_only_the_sdk_knows(srv: Server) -> None:
    tokens = make_team(srv, "frontver", "a")
    answers = _converse(srv, tokens["a"], [_hello("2099-01-01")], want={1})
    [hello] = answers
    assert hello["result"]["protocolVersion"] in json.loads(WIRE.read_text())["initialize"]
    bad = json.loads(_hello())
    del bad["params"]["clientInfo"]
    [refused] = _converse(srv, tokens["a"], [json.dumps(bad)], want={1})
    assert refused["error"]["code"] == -32602, refused
