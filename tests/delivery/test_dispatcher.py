"""The push dispatcher on a real hub: order, members added later, shutdown, settings."""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from backchannel.delivery.adapters import ADAPTERS, AdapterFactory, check_delivery_setting
from backchannel.delivery.base import Adapter, AdapterContext, AdapterError
from backchannel.delivery.claude_inbox import InboxWriter, read_inbox
from backchannel.delivery.inbox_file import InboxFileAdapter
from backchannel.errors import HeldDelivery, InvalidRequest
from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, eventually, eventually_blocking
from backchannel.types import InboxMessage, MessageKind
from tests.delivery.conftest_adapters import (
    FAST_RETRY,
    dispatching,
    running_hub,
    state_of,
    wait_state,
)


@dataclass
class Sink:
    """What the recording adapters of one test share."""

    delivered: list[tuple[str, str]] = field(default_factory=list)  # (member, text)
    fail_once: set[str] = field(default_factory=set)  # texts whose first attempt fails
    hang: set[str] = field(default_factory=set)  # texts whose delivery waits for `gate`
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)


class Recorder(Adapter):
    type = "record"

    def __init__(self, ctx: AdapterContext, sink: Sink) -> None:
        super().__init__(ctx)
        self.sink = sink
        self.retry = FAST_RETRY

    async def deliver(self, item: InboxMessage) -> str:
        text = item.message.text
        if text in self.sink.fail_once:
            self.sink.fail_once.discard(text)
            raise AdapterError(f"{text} failed once")
        if text in self.sink.hang:
            self.sink.entered.set()
            try:
                await self.sink.gate.wait()
            except asyncio.CancelledError:
                self.sink.cancelled.append(text)
                raise
        self.sink.delivered.append((self.ctx.member, text))
        return "recorded"

    async def close(self) -> None:
        self.sink.closed.append(self.ctx.member)


def _with(sink: Sink) -> dict[str, AdapterFactory]:
    return {**ADAPTERS, "record": lambda ctx: Recorder(ctx, sink)}


async def _delivered(sink: Sink, n: int) -> list[tuple[str, str]]:
    async def check() -> bool:
        return len(sink.delivered) >= n

    await eventually(check, what=f"{n} deliveries")
    return sink.delivered


async def test_per_member_order_is_kept_through_retries() -> None:
    sink = Sink(fail_once={"a-3", "a-11", "b-5"})
    async with running_hub() as hub:
        await hub.add_member("t", "a", delivery={"type": "record"})
        await hub.add_member("t", "b", delivery={"type": "record"})
        async with dispatching(hub, adapters=_with(sink), batch=4) as d:
            for i in range(15):
                await hub.send("t", "user", "a", f"a-{i}", link=False)
                await hub.send("t", "user", "b", f"b-{i}", link=False)
            await _delivered(sink, 30)
            assert not sink.fail_once  # each failed once and was retried
            assert sum(s.retried for s in d.status()) == 3
    for member in ("a", "b"):
        got = [text for m, text in sink.delivered if m == member]
        assert got == [f"{member}-{i}" for i in range(15)]


class Overrunning(Recorder):
    """Breaks the contract: its first attempt at each message never ends, whatever its
    ``attempt_timeout`` says."""

    type = "overrun"

    def __init__(self, ctx: AdapterContext, sink: Sink) -> None:
        super().__init__(ctx, sink)
        self.attempt_timeout = 0.3

    async def deliver(self, item: InboxMessage) -> str:
        if item.attempt == 1:
            await asyncio.Event().wait()
        return await super().deliver(item)


async def test_an_attempt_past_its_timeout_is_cut_off_and_retried_in_order() -> None:
    # the worker's lease on a copy covers one attempt of attempt_timeout; an adapter
    # that overruns it must not hold the member (nor outlive the lease) for good
    sink = Sink()
    adapters = {**_with(sink), "overrun": lambda ctx: Overrunning(ctx, sink)}
    async with running_hub() as hub:
        await hub.add_member("t", "a", delivery={"type": "overrun"})
        await hub.add_member("t", "b", delivery={"type": "record"})
        async with dispatching(hub, adapters=adapters) as d:
            first = await hub.send("t", "user", "a", "a-1", link=False)
            await hub.send("t", "user", "a", "a-2", link=False)
            await hub.send("t", "user", "b", "b-1", link=False)
            st = await wait_state(hub, "t", first.message_id, "acked", within=10)
            await _delivered(sink, 3)
            worker = next(s for s in d.status() if s.member == "a")
    assert [text for m, text in sink.delivered if m == "a"] == ["a-1", "a-2"]
    assert ("b", "b-1") in sink.delivered
    assert worker.retried >= 1
    assert "did not finish within 1.3 s (its attempt_timeout, 0.3 s" in (worker.last_error or "")
    assert [e.event for e in st.history].count("delivered") == 1


async def test_a_worker_slow_to_stop_does_not_hold_up_the_other_members(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a's setting changes while its push hangs: its old worker gets grace_s to finish.
    # Meanwhile the scans go on: the other members' leases are renewed (no worker lost),
    # a member added meanwhile is served at once, and a's new worker starts only once
    # the old one has stopped, with a's order kept
    caplog.set_level(logging.WARNING, "backchannel.delivery.dispatcher")
    sink = Sink(hang={"hang"})
    async with running_hub() as hub:
        await hub.add_member("t", "a", delivery={"type": "record"})
        await hub.add_member("t", "b", delivery={"type": "record"})
        async with dispatching(hub, adapters=_with(sink), grace_s=6.0, ownership_s=2.0) as d:
            await hub.send("t", "user", "a", "hang", link=False)
            await asyncio.wait_for(sink.entered.wait(), 5)
            await hub.update_member("t", "a", delivery={"type": "record", "v": 2})
            d.poke()
            await eventually(lambda: "a" not in [s.member for s in d.status()], what="a's stop")
            await hub.send("t", "user", "a", "a-2", link=False)
            await hub.add_member("t", "c", delivery={"type": "record"})
            d.poke()
            to_c = await hub.send("t", "user", "c", "c-1", link=False)
            to_b = await hub.send("t", "user", "b", "b-1", link=False)
            await wait_state(hub, "t", to_c.message_id, "acked", within=2)
            await wait_state(hub, "t", to_b.message_id, "acked", within=2)
            assert ("a", "a-2") not in sink.delivered
            # the old worker is cancelled at the end of its grace; the new one pushes
            await eventually(lambda: sink.cancelled == ["hang"], what="the old worker's end")
            sink.gate.set()
            await _delivered(sink, 4)
            to_b = await hub.send("t", "user", "b", "b-2", link=False)
            await wait_state(hub, "t", to_b.message_id, "acked")
    assert [text for m, text in sink.delivered if m == "a"] == ["hang", "a-2"]
    assert not [r for r in caplog.records if "lease on its push delivery ran out" in r.message]


async def test_one_message_is_not_held_behind_another_members_flood(tmp_path: Path) -> None:
    # a sends to b as fast as it can (b is pushed to, so its worker is busy all along);
    # c's one message to d goes out within a second each time, the flood running. On
    # SQLite: the memory store answers without ever yielding to the event loop, so an
    # in-process flood on it starves everything else by construction
    sink = Sink()
    async with Hub(SqliteStore(tmp_path / "hub.db"), check_delivery=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        for name in ("a", "b", "c", "d"):
            # b's quota raised: the flood must go on, not be refused
            settings = {"max_queued": 1_000_000} if name == "b" else None
            await hub.add_member("t", name, delivery={"type": "record"}, settings=settings)
        async with dispatching(hub, adapters=_with(sink)):
            flooding, sent = True, 0

            async def flood() -> None:
                nonlocal sent
                while flooding:
                    await hub.send("t", "a", "b", "flood", link=False)
                    sent += 1

            floods = [asyncio.create_task(flood()) for _ in range(8)]
            try:
                await eventually(lambda: sent >= 500, what="the flood to be under way")
                for i in range(3):
                    before = sent
                    one = await hub.send("t", "c", "d", f"one-{i}", link=False)
                    await wait_state(hub, "t", one.message_id, "acked", within=1.0)
                    assert sent > before, "the flood went on meanwhile"
            finally:
                flooding = False
                await asyncio.gather(*floods)
    assert [text for m, text in sink.delivered if m == "d"] == ["one-0", "one-1", "one-2"]


async def test_member_added_after_start_is_served(tmp_path: Path) -> None:
    sink = Sink()
    async with running_hub() as hub, dispatching(hub, adapters=_with(sink)) as d:
        assert d.status() == []
        await hub.add_member("t", "late", delivery={"type": "record"})
        sent = await hub.send("t", "user", "late", "welcome", link=False)
        await wait_state(hub, "t", sent.message_id, "acked")
        assert sink.delivered == [("late", "welcome")]
        assert [(s.member, s.type, s.delivered) for s in d.status()] == [("late", "record", 1)]


async def test_poke_scans_at_once() -> None:
    sink = Sink()
    async with running_hub() as hub, dispatching(hub, adapters=_with(sink), rescan_s=600) as d:
        await hub.add_member("t", "late", delivery={"type": "record"})
        sent = await hub.send("t", "user", "late", "now", link=False)
        d.poke()
        await wait_state(hub, "t", sent.message_id, "acked")


async def test_shutdown_lets_a_delivery_finish_within_the_grace() -> None:
    sink = Sink(hang={"slow"})
    async with running_hub() as hub:
        await hub.add_member("t", "a", delivery={"type": "record"})
        await hub.add_member("t", "idle", delivery={"type": "record"})
        d = await _started(hub, sink, grace_s=10)
        sent = await hub.send("t", "user", "a", "slow", link=False)
        await asyncio.wait_for(sink.entered.wait(), 10)
        stopping = asyncio.create_task(d.stop())
        await asyncio.sleep(0)
        assert not stopping.done()
        sink.gate.set()
        await asyncio.wait_for(stopping, 10)
        assert await state_of(hub, "t", sent.message_id) == "acked"
        assert sorted(sink.closed) == ["a", "idle"]
        assert _workers_left() == []


async def test_shutdown_past_the_grace_releases_what_it_holds() -> None:
    sink = Sink(hang={"stuck"})
    async with running_hub() as hub:
        await hub.add_member("t", "a", delivery={"type": "record"})
        d = await _started(hub, sink, grace_s=0.1, batch=8)
        stuck = await hub.send("t", "user", "a", "stuck", link=False)
        after = await hub.send("t", "user", "a", "after", link=False)
        await asyncio.wait_for(sink.entered.wait(), 10)
        assert await state_of(hub, "t", after.message_id) == "leased"  # same batch
        await asyncio.wait_for(d.stop(), 10)
        assert sink.cancelled == ["stuck"]
        assert sink.closed == ["a"]
        # both go back to the queue at once, not after their lease
        assert await state_of(hub, "t", stuck.message_id) == "queued"
        assert await state_of(hub, "t", after.message_id) == "queued"
        assert _workers_left() == []
        # and a new dispatcher delivers them, in order
        sink.hang.clear()
        async with dispatching(hub, adapters=_with(sink)):
            await wait_state(hub, "t", after.message_id, "acked")
        assert sink.delivered == [("a", "stuck"), ("a", "after")]


async def test_pull_members_are_left_alone_and_unknown_types_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "backchannel.delivery.dispatcher")
    async with running_hub() as hub:
        await hub.add_member("t", "p1")
        await hub.add_member("t", "p2", delivery={"type": "pull"})
        await hub.add_member("t", "odd", delivery={"type": "carrier-pigeon"})
        async with dispatching(hub) as d:
            sent = await hub.send("t", "user", "odd", "hello", link=False)
            await d.rescan()
            assert d.status() == []
            assert await state_of(hub, "t", sent.message_id) == "queued"
            got = await hub.receive("t", "odd")  # whoever pulls still gets it
            assert [g.message.text for g in got] == ["hello"]
    warnings = [r.getMessage() for r in caplog.records if "carrier-pigeon" in r.getMessage()]
    assert len(warnings) == 1  # once, not on every scan


async def test_misconfigured_push_setting_dead_letters_with_the_fix() -> None:
    async with running_hub() as hub:
        await hub.add_member("t", "a", delivery={"type": "tmux", "session": "a-1"})
        async with dispatching(hub) as d:
            sent = await hub.send("t", "user", "a", "hello", link=False)
            st = await wait_state(hub, "t", sent.message_id, "dead")
            assert d.status()[0].target.startswith("misconfigured tmux delivery")
    reason = st.deliveries[0].dead_reason or ""
    assert "without a valid 'target'" in reason
    assert "set the member's delivery to" in reason


async def test_inbox_file_adapter_writes_the_entry_once(tmp_path: Path) -> None:
    root = tmp_path / "teams"
    setting = {"type": "inbox-file", "root": str(root), "team": "cc-team", "color": "blue"}
    async with running_hub() as hub:
        await hub.add_member("t", "researcher", "claude-code", delivery=setting)
        async with dispatching(hub):
            sent = await hub.send(
                "t", "user", "researcher", "look at #7", summary="#7", message_id="m-7", link=False
            )
            st = await wait_state(hub, "t", sent.message_id, "acked")
        path = root / "cc-team" / "inboxes" / "researcher.json"
        (entry,) = read_inbox(path)
        assert {k: entry[k] for k in ("from", "text", "summary", "msg_id", "color", "read")} == {
            "from": "user",
            "text": "[From user] look at #7",
            "summary": "#7",
            "msg_id": "m-7",
            "color": "blue",
            "read": False,
        }
        assert f"written to {path}" in [e.detail for e in st.history if e.event == "delivered"]
        # a redelivery (after a crash before the hub recorded it) writes nothing
        await hub.send("t", "user", "researcher", "again", message_id="m-8", link=False)
        (item,) = await hub.receive("t", "researcher")
        adapter = InboxFileAdapter(AdapterContext(hub, "t", "researcher", setting))
        assert (await adapter.deliver(item)).startswith("written")
        assert (await adapter.deliver(item)).startswith("already in")
        assert [e["msg_id"] for e in read_inbox(path)] == ["m-7", "m-8"]


async def test_a_message_for_a_team_claude_code_deleted_is_a_dead_letter(
    tmp_path: Path,
) -> None:
    """Claude Code's TeamDelete removes the team's directory (``config.json`` and the
    inboxes). The hub made the directory again and counted the next message delivered
    into an inbox no agent reads. Now it is a dead letter naming the deleted team, the
    sender told, and no directory is made again."""
    root = tmp_path / "teams"
    team_dir = root / "cc-team"
    (team_dir / "inboxes").mkdir(parents=True)
    (team_dir / "config.json").write_text('{"name": "cc-team", "members": []}')
    setting = {"type": "inbox-file", "root": str(root), "team": "cc-team"}
    async with running_hub() as hub:
        await hub.add_member("t", "researcher", "claude-code", delivery=setting)
        async with dispatching(hub):
            first = await hub.send("t", "user", "researcher", "one", link=False)
            await wait_state(hub, "t", first.message_id, "acked")
            shutil.rmtree(team_dir)  # what TeamDelete does
            sent = await hub.send("t", "user", "researcher", "two", link=False)
            st = await wait_state(hub, "t", sent.message_id, "dead")
            notices = await hub.receive("t", "user", limit=10)
    reason = st.deliveries[0].dead_reason or ""
    assert "'cc-team' was deleted" in reason and "TeamCreate" in reason
    assert [n.message.kind for n in notices] == [MessageKind.SYSTEM]
    assert not team_dir.exists()


def _threads_in(function: str) -> int:
    """How many threads are inside ``function`` now."""
    return sum(
        any(f.f_code.co_name == function for f, _ in traceback.walk_stack(top))
        for top in sys._current_frames().values()
    )


async def test_inbox_on_a_filesystem_that_does_not_answer(tmp_path: Path) -> None:
    # the stuck member's inbox is read as on a hung network filesystem: the read does not
    # return until the test lets it (a FIFO once stood in for it, but the writer now
    # opens one without waiting and refuses it). The stuck member's copy is retried,
    # then given up with the sender told, one thread at most left waiting on it; the
    # other member's inbox is written all the same
    root = tmp_path / "teams"
    answer = threading.Event()

    class HungFilesystem(InboxWriter):
        def _load(self, path: Path) -> Any:
            if path.stem == "stuck":
                answer.wait()
            return super()._load(path)

    def adapter(ctx: AdapterContext) -> Adapter:
        a = InboxFileAdapter(ctx, writer=HungFilesystem(root, deadline_s=0.5))
        a.retry = FAST_RETRY
        return a

    stuck = {"type": "inbox-file", "root": str(root), "team": "cc"}
    try:
        async with running_hub(max_attempts=2) as hub:
            await hub.add_member("t", "stuck", delivery=stuck)
            await hub.add_member("t", "ok", delivery={**stuck, "team": "cc2"})
            async with dispatching(hub, adapters={**ADAPTERS, "inbox-file": adapter}):
                sent = await hub.send("t", "user", "stuck", "one", link=False)
                other = await hub.send("t", "user", "ok", "two", link=False)
                await wait_state(hub, "t", other.message_id, "acked", within=5)
                st = await wait_state(hub, "t", sent.message_id, "dead", within=30)
                notices = await hub.receive("t", "user", limit=10)
                # the retry did not start a second write while the first still hangs
                assert _threads_in("_load") == 1
    finally:
        answer.set()  # let the write that hangs go (it writes the inbox and ends)
    reason = st.deliveries[0].dead_reason or ""
    assert reason.startswith("gave up after 2 attempt(s): inbox ")
    assert "the filesystem does not answer" in reason
    assert [n.message.kind for n in notices] == [MessageKind.SYSTEM]


def test_check_delivery_setting() -> None:
    for ok in (
        None,
        {},
        {"type": "pull"},
        {"type": "inbox-file"},
        {"type": "tmux", "target": "a:0.1"},
        {"type": "stdin", "command": ["claude"]},
        {"type": "webhook", "service": "bot"},
    ):
        check_delivery_setting(ok)
    with pytest.raises(InvalidRequest, match="unknown delivery type 'tmx'; use one of"):
        check_delivery_setting({"type": "tmx"})
    with pytest.raises(InvalidRequest, match="needs 'target'"):
        check_delivery_setting({"type": "tmux"})
    with pytest.raises(InvalidRequest, match="never a URL"):
        check_delivery_setting({"type": "webhook", "service": "x", "url": "http://evil"})


async def _started(hub: Hub, sink: Sink, **options: Any) -> Any:
    from backchannel.delivery.dispatcher import Dispatcher

    d = Dispatcher(hub, adapters=_with(sink), rescan_s=0.1, **options)
    await d.start()
    return d


def _workers_left() -> list[str]:
    return [
        t.get_name()
        for t in asyncio.all_tasks()
        if t.get_name().startswith(("bc-deliver-", "bc-dispatcher")) and not t.done()
    ]


def test_serve_runs_the_dispatcher(server: Any, tmp_path: Path) -> None:
    """``backchannel serve`` starts the dispatcher: a member added over HTTP with an
    inbox-file delivery gets its messages written (the next scan picks it up)."""

    root = tmp_path / "teams"
    tokens = server.team("alpha")
    with server.client() as admin:
        r = admin.post(
            "/v1/teams/alpha/members",
            json={
                "name": "cc",
                "kind": "claude-code",
                "delivery": {"type": "inbox-file", "root": str(root)},
            },
        )
        assert r.status_code == 201, r.text
    with server.client(tokens["user"]) as user:
        r = user.post("/v1/messages", json={"to": "cc", "text": "hi", "message_id": "srv-1"})
        assert r.status_code == 201, r.text
        eventually_blocking(
            lambda: user.get("/v1/messages/srv-1").json()["status"] == "acked",
            what="the server to push srv-1",
            within=20,
        )
    assert [e["msg_id"] for e in read_inbox(root / "alpha" / "inboxes" / "cc.json")] == ["srv-1"]


class Dialog(Recorder):
    """A pane with a dialog on screen that nobody answers: every copy is held."""

    type = "dialog"

    async def deliver(self, item: InboxMessage) -> str:
        raise HeldDelivery("a dialog is on screen", shows="Do you want to proceed?")

    async def ready(self) -> str | None:
        return "a dialog is on screen"


async def test_a_hold_counts_from_its_first_hold_across_a_restart(tmp_path: Path) -> None:
    """A copy held by a dialog nobody answers is given up ``hold_max`` after it was
    first held, not ``hold_max`` after the hub restarted: a hub started again on the same
    SQLite file (or one taking the member over) goes on counting from the first hold the
    store recorded, and gives the copy up at once when that is past. Nothing was typed,
    so the give-up spends no attempt."""
    sink = Sink()
    adapters = {**ADAPTERS, "dialog": lambda ctx: Dialog(ctx, sink)}
    path, clock = tmp_path / "hold.db", FakeClock()

    def hub_on_file() -> Hub:
        return Hub(SqliteStore(path), clock=clock, check_delivery=False)

    async with hub_on_file() as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "a", delivery={"type": "dialog", "hold_max": 3600})
        async with dispatching(hub, adapters=adapters) as d:
            sent = await hub.send("t", "user", "a", "one", link=False)

            async def held() -> bool:
                return [s.state for s in d.status()] == ["held"]

            await eventually(held, what="the copy held")
        assert await state_of(hub, "t", sent.message_id) == "queued"
    clock.advance(3601)  # the hub was down for longer than the hold's bound
    async with hub_on_file() as hub, dispatching(hub, adapters=adapters):
        st = await wait_state(hub, "t", sent.message_id, "dead", within=10)
    reason = st.deliveries[0].dead_reason or ""
    assert "a's screen showed 'Do you want to proceed?' for 60 minutes" in reason, reason
    assert st.deliveries[0].attempts == 0
    assert [e.event for e in st.history].count("held") == 1
