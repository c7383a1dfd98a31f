"""Every MCP tool's answer fits what Codex keeps of it, and nothing it leaves out is lost.

Codex keeps 10,000 bytes of a tool's answer (its start and its end, a marker for the
middle) and shows the model the answer's structured content as compact JSON
(tests/realcli/test_hook_long.py). An answer past that was cut mid-line with no way to
read the rest: ``list_members`` of members with many long sessions, ``list_timers`` of
long notes, ``get_session_data`` of long events, ``delegate`` echoing a long task, a
broadcast to a big team. Each answer here is the worst case the hub accepts, measured
as Codex counts it; following each answer's own "next" calls reads every member, timer
and event exactly once. Real ``/mcp`` of a real ``serve``."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, TextIO

import pytest
from mcp import ClientSession

from backchannel.interfaces.mcp import ANSWER_BYTES
from tests.conftest import Server
from tests.runtimes.agents import make_team, memory_session
from tests.test_mcp import connect, errlog, fails, srv
from tests.test_mcp_long import _seen

__all__ = ["errlog", "srv"]  # the fixtures, used here too

#: what Codex keeps of a tool's answer
CODEX_KEEPS = 10_000


def codex_bytes(structured: Any) -> int:
    """The bytes of a tool's answer as Codex shows it to the model (``serde_json`` of its
    structured content: quotes, backslashes and control characters escaped)."""
    return len(json.dumps(structured, ensure_ascii=False, separators=(",", ":")).encode())


async def answer(s: ClientSession, tool: str, **args: Any) -> tuple[str, Any]:
    result = await s.call_tool(tool, args)
    [content] = result.content
    shown = getattr(content, "text", "")
    assert not result.is_error, shown
    size = codex_bytes(result.structured_content)
    assert size <= ANSWER_BYTES < CODEX_KEEPS, (tool, args, size, shown[-400:])
    assert len(shown.encode()) <= ANSWER_BYTES
    return shown, result.structured_content


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_list_members_of_many_long_sessions_fits_and_reads_every_member_once(
    srv: Server, errlog: TextIO, transport: str
) -> None:
    """Members of the longest names, one with 80 open sessions of the longest ids, one
    whose session's last output is 50,000 characters: each page fits, the pages read
    through their own calls name every member once, and the member whose sessions do
    not fit in one answer is shown with as many as fit and how many more it has."""
    names = [f"m{i:02d}" + "x" * 61 for i in range(60)]
    tokens = make_team(srv, f"members-long-{transport}", *names)
    many = [f"{i:03d}-" + "s" * 195 for i in range(80)]
    with srv.client(tokens[names[3]]) as c:
        for sid in many:
            c.post("/v1/sessions", json={"session_id": sid}).raise_for_status()
    with srv.client(tokens[names[5]]) as c:
        c.post("/v1/sessions", json={"session_id": "talker"}).raise_for_status()
        for kind, text in (("turn_start", ""), ("agent_stop", "中文 output\n" * 5000)):
            body = {"kind": kind, "text": text}
            c.post("/v1/sessions/talker/events", json=body).raise_for_status()
    seen: list[str] = []
    sessions_shown: list[str] = []
    hidden = 0
    async with connect(transport, srv, tokens[names[0]], None, errlog) as s:
        args: dict[str, Any] = {}
        for _ in range(100):
            shown, data = await answer(s, "list_members", **args)
            seen += re.findall(r"^- ([A-Za-z0-9_-]+)", shown, re.M)
            assert [m["name"] for m in data["members"]] == seen[len(seen) - len(data["members"]) :]
            for line in shown.splitlines():
                if line.startswith(f"- {names[3]}, "):
                    sessions_shown += re.findall(r"(\d{3}-s+) \(idle\)", line)
                    more = re.search(r"and (\d+) more open", line)
                    hidden += int(more[1]) if more else 0
            nxt = re.search(r'call list_members\(after="([^"]+)"\)', shown)
            if nxt is None:
                assert data["next_after"] is None
                break
            assert data["next_after"] == nxt[1]
            args = {"after": nxt[1]}
    assert seen == sorted([*names, "user"]), "every member once, in order"
    assert sessions_shown == many[: len(sessions_shown)] and sessions_shown
    assert len(sessions_shown) + hidden == len(many), "the ones not shown are counted"


def _timer_ids(shown: str) -> list[int]:
    return [int(t) for t in re.findall(r"^(\d+): anchor for ", shown, re.M)]


async def test_list_timers_of_long_notes_fits_and_reads_every_timer_once(
    srv: Server, errlog: TextIO
) -> None:
    """Timers with the longest notes the hub takes (2,000 characters, of emoji, quotes
    and line ends that JSON writes in two to four bytes each) among short ones: each
    page fits, and the pages read through their own calls show every timer once, its
    note whole."""
    tokens = make_team(srv, "timers-long", "a")
    notes = []
    for i in range(70):
        if i % 3 == 0:
            notes.append(f"task {i} " + ("😀" * 1990))
        elif i % 3 == 1:
            notes.append(f"task {i} " + ('say "x"\\ ' * 200)[:1990])
        else:
            notes.append(f"task {i}, short")
    every = []
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
        for note in notes:
            body = {"intent": "anchor", "minutes": 60, "note": note}
            r = c.post("/v1/timers", json=body)
            r.raise_for_status()
            every.append(r.json()["timer_id"])
    seen: list[int] = []
    async with connect("http", srv, tokens["a"], "a-1", errlog) as s:
        args: dict[str, Any] = {}
        for _ in range(100):
            shown, data = await answer(s, "list_timers", **args)
            ids = _timer_ids(shown)
            assert ids == [t["timer_id"] for t in data["timers"]] and ids
            for t in ids:
                note = notes[every.index(t)].strip()
                assert f" s: {note}\n" in shown + "\n", note[:40]
            seen += ids
            nxt = re.search(r"call list_timers\(after=(\d+)\)", shown)
            if nxt is None:
                assert data["next_after"] is None
                break
            args = {"after": int(nxt[1])}
    assert seen == every, "every timer once, in the order set"


def _long_event(n: int) -> str:
    return "".join(f"{i:05d} 中文的长行 a line of a tool's long output\n" for i in range(n))


async def test_get_session_data_of_long_events_fits_and_reads_every_event_once(
    srv: Server, errlog: TextIO
) -> None:
    """A transcript of events of 2,000 characters around one of 50,000: each answer fits,
    and following each answer's own call (``since``, and ``start`` inside the long one)
    reads every event once, the long one whole in parts, every character once."""
    tokens = make_team(srv, "events-long", "a", "w")
    texts = [f"event {i} " + "中文 and words\n" * 140 for i in range(12)]
    texts.insert(6, _long_event(1100))  # about 50,000 characters, 60,000 bytes
    with srv.client(tokens["w"]) as c:
        c.post("/v1/sessions", json={"session_id": "w-1"}).raise_for_status()
        c.post("/v1/sessions/w-1/events", json={"kind": "turn_start"}).raise_for_status()
        ids = []
        for text in texts:
            r = c.post("/v1/sessions/w-1/events", json={"kind": "tool_result", "text": text})
            r.raise_for_status()
            ids.append(r.json()["event_id"])
    whole: list[int] = []
    parts: dict[int, list[tuple[int, int]]] = {}
    async with connect("http", srv, tokens["a"], None, errlog) as s:
        args: dict[str, Any] = {"session": "w"}  # by member name: its latest session
        for _ in range(100):
            shown, data = await answer(s, "get_session_data", **args)
            events = [e["event_id"] for e in data["events"]]
            if "start" in data:
                [e] = events
                start, end = data["start"], data["end"]
                assert texts[ids.index(e)][start:end] in shown
                parts.setdefault(e, []).append((start, end))
            else:
                for e in set(events) & set(ids):
                    assert f"#{e} turn 1 tool_result: {texts[ids.index(e)]}" in shown
                whole += [e for e in events if e in ids]
            nxt = re.search(
                r'get_session_data\(session="w-1", since=(\d+)(?:, start=(\d+))?\)', shown
            )
            if nxt is None:
                break
            args = {"session": "w-1", "since": int(nxt[1])}
            if nxt[2]:
                args["start"] = int(nxt[2])
    long_id = ids[6]
    assert whole == [e for e in ids if e != long_id], "every short event once, in order"
    ranges = parts[long_id]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(texts[6]) and len(ranges) > 5
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), ranges


async def test_get_session_data_tail_fits_and_says_how_to_read_the_rest(
    srv: Server, errlog: TextIO
) -> None:
    """The tail of a transcript past one answer shows the last events that fit and names
    the call that reads the earlier ones; a last event past one answer shows its end and
    the call that reads it whole from its start."""
    tokens = make_team(srv, "tail-long", "a", "w")
    long = _long_event(1100)
    with srv.client(tokens["w"]) as c:
        c.post("/v1/sessions", json={"session_id": "w-1"}).raise_for_status()
        c.post("/v1/sessions/w-1/events", json={"kind": "turn_start"}).raise_for_status()
        for i in range(10):
            body = {"kind": "thought", "text": f"thought {i} " + "x" * 3000}
            c.post("/v1/sessions/w-1/events", json=body).raise_for_status()
        body = {"kind": "agent_output", "text": long}
        last = c.post("/v1/sessions/w-1/events", json=body).json()["event_id"]
    async with connect("http", srv, tokens["a"], None, errlog) as s:
        shown, data = await answer(s, "get_session_data", session="w-1", tail_chars=1_000_000)
        assert [e["event_id"] for e in data["events"]] == [last]
        end = shown.partition(f"\n[event #{last} is longer")[0]
        assert long.endswith(end[-4000:]) and len(end) > 4000
        assert (
            f'read it whole from its start with get_session_data(session="w-1", since={last - 1})'
            in shown
        )
        first, data = await answer(s, "get_session_data", session="w-1", since=last - 1)
        assert data["start"] == 0 and long[: data["end"]] in first
        shown, data = await answer(s, "get_session_data", session="w-1", tail_chars=20_000)
        assert 'read them a page at a time with get_session_data(session="w-1", since=0)' in shown


async def test_a_broadcast_to_a_big_team_fits_and_counts_the_rest(
    srv: Server, errlog: TextIO
) -> None:
    """A broadcast named every recipient: to a team of 160 members of long names the
    answer was 21,000 bytes, which Codex cut. It names as many as fit and counts the
    rest."""
    names = [f"r{i:03d}" + "y" * 60 for i in range(160)]
    tokens = make_team(srv, "answers-wide", "a", *names)
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
    async with connect("http", srv, tokens["a"], "a-1", errlog) as s:
        shown, data = await answer(s, "send_message", to="*", message="hello all")
    assert shown.startswith(f"Sent to {names[0]}, ")
    assert data["more_recipients"] > 0
    assert f"and {data['more_recipients']} more (message_id " in shown
    assert len(data["recipients"]) + data["more_recipients"] == len(names) + 1


async def test_delegate_of_a_long_task_fits(srv: Server, errlog: TextIO) -> None:
    """``delegate`` echoed its task three times (in its text, the JSON of its answer and
    the structured content): a task of 30,000 characters made an answer Codex cut. The
    answer now fits, the task shown cut (the model wrote it) and saying so."""
    tokens = make_team(srv, "answers-task", "a", "b")
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
        c.post("/v1/sessions/a-1/events", json={"kind": "turn_start"}).raise_for_status()
    async with connect("http", srv, tokens["a"], "a-1", errlog) as s:
        if "delegate" not in {t.name for t in (await s.list_tools()).tools}:
            return  # a hub without delegation
        task = "do this: " + "a step of the task\n" * 1600
        shown, data = await answer(s, "delegate", to="b", task=task)
    assert shown.startswith("Delegated to b; this returns at once")
    assert data["task"].startswith("do this: ") and "more characters not shown" in data["task"]


async def test_messages_json_writes_long_are_read_whole_within_the_budget(
    srv: Server, errlog: TextIO
) -> None:
    """Messages of quotes, backslashes, line ends and control characters, which JSON
    writes in two to six bytes each: ``check_inbox`` cut their parts by plain bytes, and
    its answer was 14,500 bytes (42,500 of control characters) as Codex counts it, which
    Codex cut in the middle of a part the hub then counted read. Every answer now fits,
    and the parts each names read every message whole, once."""
    tokens = make_team(srv, "dense", "a", "b")
    texts = ["x\x01\x02\x1f" * 4000, '"quoted" ' * 2000, "C:\\dir\\\n" * 2500]
    with srv.client(tokens["b"]) as c:
        for text in texts:
            c.post("/v1/messages", json={"to": "a", "text": text}).raise_for_status()
    read: list[str] = []
    async with connect("http", srv, tokens["a"], None, errlog) as s:
        for _ in range(len(texts) + 1):
            shown, data = await answer(s, "check_inbox")
            if not data["messages"]:
                break
            for m in data["messages"]:
                got = [_seen(shown)] if len(data["messages"]) == 1 else []
                for part in range(2, m.get("parts", 1) + 1):
                    said = f"read_message with message_id={m['message_id']!r} and part={part}"
                    assert said in shown, shown[-300:]
                    shown, _ = await answer(
                        s, "read_message", message_id=m["message_id"], part=part
                    )
                    got.append(_seen(shown))
                read.append("".join(got))
    assert read == texts, [(len(r), len(t)) for r, t in zip(read, texts, strict=False)]


async def test_a_timer_note_json_writes_past_one_answer_is_shown_cut_saying_so(
    srv: Server, errlog: TextIO
) -> None:
    """The hub takes a note of 2,000 control characters, 12,000 bytes in JSON: the one
    timer's answer was past what Codex keeps. It is shown cut, saying how much more."""
    tokens = make_team(srv, "timer-dense", "a")
    note = "remember: " + "\x01" * 1990
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
        body = {"intent": "anchor", "minutes": 60, "note": note}
        ident = c.post("/v1/timers", json=body).json()["timer_id"]
    async with connect("http", srv, tokens["a"], "a-1", errlog) as s:
        shown, data = await answer(s, "list_timers")
    assert [t["timer_id"] for t in data["timers"]] == [ident] and data["next_after"] is None
    kept = shown.partition(" s: ")[2].partition(" […note cut here")[0]
    assert note.startswith(kept) and len(kept) > 1000
    assert (
        f"{len(note) - len(kept)} more characters; read_timer(id={ident}) reads it whole" in shown
    )


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_read_timer_reads_a_note_whole_that_a_list_shows_cut(
    srv: Server, errlog: TextIO, transport: str
) -> None:
    """No tool read a timer's note whole: ``list_timers`` cut a note JSON writes long,
    and a teammate's was read nowhere else. ``read_timer(id)`` reads one timer of the
    team (pending, fired or cancelled) with its note, in parts when it is longer than one
    answer, each naming the start of the next; an id of no timer of the team is refused."""
    tokens = make_team(srv, f"timer-read-{transport}", "a", "b")
    dense = "remember:\n" + "\x01" * 1500 + "\nthen: " + "\x02" * 480
    with srv.client(tokens["b"]) as c:
        c.post("/v1/sessions", json={"session_id": "b-1"}).raise_for_status()
        body = {"intent": "anchor", "minutes": 60, "note": dense}
        theirs = c.post("/v1/timers", json=body).json()["timer_id"]
        body = {"intent": "anchor", "minutes": 60, "note": "short and plain"}
        gone = c.post("/v1/timers", json=body).json()["timer_id"]
        c.delete(f"/v1/timers/{gone}").raise_for_status()
    other = make_team(srv, f"timer-read-other-{transport}", "z")
    with srv.client(other["z"]) as c:
        c.post("/v1/sessions", json={"session_id": "z-1"}).raise_for_status()
        body = {"intent": "anchor", "minutes": 60, "note": "another team's"}
        foreign = c.post("/v1/timers", json=body).json()["timer_id"]
    async with connect(transport, srv, tokens["a"], None, errlog) as s:
        shown, _ = await answer(s, "list_timers")
        assert f"read_timer(id={theirs}) reads it whole" in shown
        parts, start = [], 0
        while True:
            shown, data = await answer(s, "read_timer", id=theirs, start=start)
            assert data["timer_id"] == theirs and data["member"] == "b" and "note" not in data
            assert data["start"] == start
            note = shown.partition(": ")[2] if not start else shown.partition("): ")[2]
            if data["next_start"] is None:
                parts.append(note)
                break
            cut = f"\n[…the note goes on: {len(dense) - data['next_start']} more characters; "
            assert cut in note, note[-200:]
            parts.append(note.partition(cut)[0])
            assert f"call read_timer(id={theirs}, start={data['next_start']})" in shown
            start = data["next_start"]
        assert len(parts) > 1 and "".join(parts) == dense
        shown, data = await answer(s, "read_timer", id=gone)
        assert data["state"] == "cancelled" and shown.endswith("cancelled. Note: short and plain")
        said = await fails(s, "read_timer", id=foreign)
        assert f"no timer {foreign} in team" in said, said
        said = await fails(s, "read_timer", id=theirs, start=len(dense) + 1)
        assert f"note has {len(dense)} characters" in said, said


async def test_get_session_data_start_refuses_what_it_cannot_read(
    srv: Server, errlog: TextIO
) -> None:
    """``start`` reads on in one event: with ``tail_chars``, past the event's end, or
    with no event after ``since``, the error says so and what to call instead."""
    tokens = make_team(srv, "start-bad", "a", "w")
    with srv.client(tokens["w"]) as c:
        c.post("/v1/sessions", json={"session_id": "w-1"}).raise_for_status()
        ident = c.post("/v1/sessions/w-1/events", json={"kind": "turn_start"}).json()
        body = {"kind": "thought", "text": "x" * 20_000}
        last = c.post("/v1/sessions/w-1/events", json=body).json()["event_id"]
    async with connect("http", srv, tokens["a"], None, errlog) as s:
        said = await fails(s, "get_session_data", session="w-1", tail_chars=10, start=5)
        assert "argument 'start'" in said and "without tail_chars" in said, said
        said = await fails(s, "get_session_data", session="w-1", since=last - 1, start=20_000)
        assert f"past the end of event #{last}: its text is 20000 characters" in said, said
        said = await fails(s, "get_session_data", session="w-1", since=last, start=1)
        assert f"no event of session w-1 follows event {last}" in said, said
        shown, data = await answer(
            s, "get_session_data", session="w-1", since=last - 1, start=19_000
        )
        assert data["start"] == 19_000 and data["end"] == 20_000 and data["next_since"] is None
        assert shown.endswith("): " + "x" * 1000), shown[-200:]  # the last part: no note
        assert ident["event_id"] < last


async def test_set_timer_and_cancel_timer_of_the_longest_notes_fit(
    srv: Server, errlog: TextIO
) -> None:
    """``set_timer`` echoed its note twice (its text and its structured content): a note
    of 2,000 CJK characters made 12,000 bytes, of control characters 24,000. The note is
    shown once, whole when it fits, else cut saying how much more; the timer's id and how
    to cancel it are always there."""
    tokens = make_team(srv, "timer-set", "a")
    with srv.client(tokens["a"]) as c:
        c.post("/v1/sessions", json={"session_id": "a-1"}).raise_for_status()
    async with connect("http", srv, tokens["a"], "a-1", errlog) as s:
        cjk = "中文的提醒" * 400
        shown, data = await answer(s, "set_timer", intent="anchor", minutes=60, note=cjk)
        assert f"with: {cjk}. cancel_timer(id={data['timer_id']}) cancels it." in shown
        dense = "x" + "\x01" * 1999
        shown, data = await answer(s, "set_timer", intent="anchor", minutes=60, note=dense)
        assert shown.endswith(f"more characters]. cancel_timer(id={data['timer_id']}) cancels it.")
        shown, data = await answer(s, "cancel_timer", id=data["timer_id"])
        assert data["state"] == "cancelled", data


async def test_an_answer_no_tool_bounded_is_cut_saying_so(monkeypatch: Any) -> None:
    """The last resort: a tool's answer that its tool did not bound (a case no tool
    foresaw) is cut by the server to fit, saying how much it left out, not cut by the
    client in its middle without a word."""
    from backchannel.interfaces import mcp

    async def loud(a: mcp.Agent, x: Any) -> tuple[str, Any]:
        return "start\n" + "中" * 20_000 + "\nend", {"items": ["x" * 100] * 100}

    tool = mcp.Tool("loud", "An answer too long.", mcp._NoArgs, loud)
    monkeypatch.setattr(mcp, "TOOLS", (*mcp.TOOLS, tool))

    async with memory_session(mcp.Agent(None, "t", "a"), delegate=False) as s:  # type: ignore[arg-type]
        shown, data = await answer(s, "loud")
    kept = shown.partition("\n[… answer cut")[0]
    assert kept.startswith("start\n中") and len(kept) > 2000
    assert f"cut to fit one tool answer: {20_010 - len(kept)} more characters]" in shown
    assert data["cut"] == 20_010 - len(kept)
