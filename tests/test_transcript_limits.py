"""Transcript caps count whole events; event data is bounded where it comes in; views
show whatever is stored without failing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from backchannel import Hub
from backchannel.core import turns
from backchannel.errors import InvalidRequest, TooLarge
from backchannel.stores.sqlite import SqliteStore
from backchannel.types import EventKind, SessionEvent
from tests.conftest import Server, start_server


def _nested(depth: int) -> dict[str, Any]:
    data: dict[str, Any] = {}
    cur = data
    for _ in range(depth - 1):
        cur["x"] = {}
        cur = cur["x"]
    return data


async def _session(hub: Hub) -> None:
    await hub.create_team("t")
    await hub.add_member("t", "w")
    await hub.open_session("t", "w", "w-1")
    await hub.report_event("t", "w", "w-1", "turn_start", "task")


async def test_event_data_is_bounded_where_events_come_in(hub: Hub) -> None:
    await _session(hub)
    with pytest.raises(InvalidRequest, match="nests more than 32 levels"):
        await hub.report_event("t", "w", "w-1", "thought", "deep", _nested(300))
    with pytest.raises(TooLarge, match="over the 65536-character limit") as exc:
        await hub.report_event("t", "w", "w-1", "tool_result", "big", {"out": "x" * 250_000})
    assert exc.value.details["size"] > 250_000
    await hub.report_event("t", "w", "w-1", "thought", "ok", _nested(32))
    data = await hub.get_session_data("t", "w-1")
    assert [e["text"] for e in data["events"]][-1] == "ok"


async def test_caps_count_data_as_well_as_text(hub: Hub) -> None:
    await _session(hub)
    for i in range(40):
        await hub.report_event("t", "w", "w-1", "tool_result", f"r{i}", {"out": "y" * 60_000})
    one = await hub.get_session_data("t", "w-1", max_chars=1)
    assert len(json.dumps(one)) < 2_000
    assert one["truncated"] is True
    # a page never holds much more than max_chars, and paging reaches every event
    seen: list[int] = []
    since = 0
    while True:
        page = await hub.get_session_data("t", "w-1", since=since, max_chars=150_000)
        body = json.dumps(page["events"])
        assert len(body) <= 150_000 + 60_500  # the cap, plus the one event that crosses it
        seen += [e["event_id"] for e in page["events"]]
        if page["next_since"] is None:
            break
        since = page["next_since"]
    assert len(seen) == len(set(seen)) == 42  # session, turn_start, 40 results
    tail = await hub.get_session_data("t", "w-1", tail_chars=100_000)
    assert len(json.dumps(tail["events"])) < 100_000 + 2_000
    assert tail["events"][-1]["text"] == "r39"
    assert tail["truncated"] is True
    assert "earlier event(s) cut" in tail["note"]


def test_page_rule_leaves_out_data_it_cannot_show() -> None:
    deep = SessionEvent("t", "s", 1, 0.0, EventKind.THOUGHT, "hi", _nested(400), 7)
    page = turns.page_transcript([deep], max_chars=100, tail_chars=None, more=False)
    assert page.events[0].data == {"omitted": "data nests deeper than 32 levels"}
    big = SessionEvent("t", "s", 1, 0.0, EventKind.THOUGHT, "hi", {"x": "z" * 5_000}, 8)
    page = turns.page_transcript([big], max_chars=100, tail_chars=None, more=False)
    assert page.events[0].text == "hi"
    assert "cut to fit the page" in page.events[0].data["omitted"]


@pytest.mark.slow
def test_stored_deep_data_never_breaks_a_view_over_http(tmp_path: Path) -> None:
    srv: Server = start_server(tmp_path / "home")
    try:
        tokens = srv.team("deep", "w")
        with srv.client(tokens["w"]) as w:
            sid = w.post("/v1/sessions", json={}).json()["session_id"]
            w.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start", "text": "go"})
            r = w.post(
                f"/v1/sessions/{sid}/events",
                json={"kind": "thought", "text": "x", "data": {"a": "b" * 250_000}},
            )
            assert r.status_code == 413, r.text
            assert r.json()["error"]["code"] == "too_large"

        # data stored before the limits existed (written straight into the database)
        async def plant() -> None:
            async with SqliteStore(srv.store_url.removeprefix("sqlite://")) as store:
                ev = SessionEvent("deep", sid, 1, 0.0, EventKind.THOUGHT, "deep", _nested(300))
                await store.transact(lambda tx: tx.append_event(ev))

        asyncio.run(plant())
        with srv.client(tokens["w"]) as w:
            r = w.get(f"/v1/sessions/{sid}/transcript")
            assert r.status_code == 200, r.text
            assert r.json()["events"][-1]["data"]["omitted"].startswith("data nests deeper")
        with srv.client() as admin:
            r = admin.get(f"/v1/dashboard/teams/deep/sessions/{sid}")
            assert r.status_code == 200, r.text
            assert r.json()["transcript"][-1]["text"] == "deep"
    finally:
        srv.stop()


async def test_the_tail_of_many_empty_events_is_bounded_in_count(hub: Hub) -> None:
    await _session(hub)
    for _ in range(60):
        await hub.report_event("t", "w", "w-1", "thought")
    tail = await hub.get_session_data("t", "w-1", tail_chars=1_000, limit=25)
    assert len(tail["events"]) == 25
    assert tail["truncated"] is True
