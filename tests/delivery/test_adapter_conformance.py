"""Every built-in push adapter, and the recording adapter, passes ``check_adapter``: the
check users run against their own adapters."""

from __future__ import annotations

from pathlib import Path

import pytest

from backchannel.delivery.base import Adapter, AdapterContext, AdapterError
from backchannel.delivery.inbox_file import InboxFileAdapter
from backchannel.delivery.tmux import TmuxAdapter
from backchannel.delivery.webhook import WebhookAdapter
from backchannel.testing import Recording, RecordingAdapter, check_adapter, eventually
from backchannel.types import InboxMessage
from tests.delivery.conftest_adapters import answer, endpoint, running_hub, tmux_server


async def test_the_recording_adapter_keeps_what_it_is_handed_and_passes_the_check() -> None:
    recording = Recording()
    async with running_hub() as hub:
        ctx = AdapterContext(hub, "t", "a", {"type": "record"})
        # it shows a copy handed over twice twice: the record of what happened
        await check_adapter(
            RecordingAdapter.factory(recording),
            ctx,
            lambda: "\n".join(recording.texts()),
            rereads=False,
        )
    assert [t.split()[0] for t in recording.texts("a")] == ["first", "second", "first", "third"]
    assert recording.started == recording.closed == ["a"]
    assert recording.texts("b") == []


async def test_the_inbox_file_adapter_passes(tmp_path: Path) -> None:
    inbox = tmp_path / "t" / "inboxes" / "a.json"
    async with running_hub() as hub:
        ctx = AdapterContext(hub, "t", "a", {"type": "inbox-file", "root": str(tmp_path)})
        await check_adapter(
            InboxFileAdapter,
            ctx,
            lambda: inbox.read_text() if inbox.exists() else "",
            impossible={"type": "inbox-file", "root": ["not", "a", "path"]},
            failing={"type": "inbox-file", "root": str(inbox.parent / "a.json" / "under")},
        )


async def test_the_webhook_adapter_passes_with_a_receiver_that_drops_repeats() -> None:
    with endpoint(answer(200)) as ok, endpoint(answer(503)) as busy:

        def received() -> str:
            # what a receiver keeps that drops repeats by their Idempotency-Key
            kept = {r.headers["idempotency-key"]: r.body.decode() for r in ok.seen}
            return "\n".join(kept.values())

        async with running_hub({"ok": ok.url, "busy": busy.url}) as hub:
            ctx = AdapterContext(hub, "t", "a", {"type": "webhook", "service": "ok"})
            await check_adapter(
                WebhookAdapter,
                ctx,
                received,
                impossible={"type": "webhook", "service": "unregistered"},
                failing={"type": "webhook", "service": "busy"},
            )
        assert busy.count() == 1, "the check's failing delivery was tried once"


async def test_the_tmux_adapter_passes(tmp_path: Path) -> None:
    out = tmp_path / "cat.txt"
    with tmux_server() as server:
        server.new_session(session_name="cat", window_command=f"exec cat > {out}", x=200, y=50)
        server.new_session(session_name="shell", window_command="exec sleep 600", x=200, y=50)
        await eventually(out.exists, what="cat to start")
        base = {"type": "tmux", "socket_name": server.socket_name, "agent_commands": ["cat"]}
        async with running_hub() as hub:
            ctx = AdapterContext(hub, "t", "a", {**base, "target": "cat"})
            await check_adapter(
                TmuxAdapter,
                ctx,
                out.read_text,
                rereads=False,  # a pane cannot be asked what it already showed
                impossible={**base, "target": "no-such-pane"},
                failing={**base, "target": "shell"},  # held: not the agent in front
            )


class _Forgetful(Adapter):
    """Breaks the contract twice: writes a copy again, and calls a missing service
    retryable."""

    type = "forgetful"
    shown: list[str] = []  # noqa: RUF012 - one list for the test

    async def deliver(self, item: InboxMessage) -> str:
        if self.ctx.option("broken"):
            raise AdapterError("no such service")
        self.shown.append(item.message.text)
        return "shown"


async def test_the_check_finds_an_adapter_that_shows_a_copy_twice() -> None:
    async with running_hub() as hub:
        ctx = AdapterContext(hub, "t", "a", {"type": "forgetful"})
        with pytest.raises(AssertionError, match="shown 2 times"):
            await check_adapter(_Forgetful, ctx, lambda: "\n".join(_Forgetful.shown))
        with pytest.raises(AssertionError, match="retryable AdapterError"):
            await check_adapter(
                _Forgetful,
                ctx,
                lambda: "\n".join(_Forgetful.shown),
                rereads=False,
                impossible={"broken": True},
            )


async def test_the_check_finds_an_adapter_that_skips_the_base_setting_checks() -> None:
    class Careless(RecordingAdapter):
        def __init__(self, ctx: AdapterContext) -> None:
            self.ctx = ctx  # no super().__init__: the setting is never checked

    async with running_hub() as hub:
        ctx = AdapterContext(hub, "t", "a", {"type": "record"})
        with pytest.raises(AssertionError, match="must be refused at construction"):
            await check_adapter(Careless, ctx, str)
