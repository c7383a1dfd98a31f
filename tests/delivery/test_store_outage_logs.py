"""A hub's background loops while its store is away: each says so in one short line
(naming the store and the way out), backs off, and says once when it works again. A
traceback twice a second from each loop buries everything else in the log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from backchannel.delivery.dispatcher import Dispatcher
from backchannel.delivery.inbox_watch import InboxBridge
from backchannel.hub import Hub
from backchannel.stores.postgres import PostgresStore
from backchannel.testing import eventually
from tests.stores.test_postgres_hubs import Proxy

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]

OUTAGE_S = 6.0  # long enough for a dozen tries of a loop that retries twice a second


class Records(logging.Handler):
    """Every record of backchannel's loggers, as it comes."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def loud(self, since: int = 0) -> list[logging.LogRecord]:
        return [r for r in self.records[since:] if r.levelno >= logging.WARNING]


async def test_a_store_outage_is_told_once_per_loop_and_its_end_once(
    new_postgres_url: Callable[[], str], tmp_path: Path
) -> None:
    url = new_postgres_url()
    parts = urlsplit(url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    store = PostgresStore(proxy.url(url), connect_timeout=1, fallback_interval=0.5)
    seen = Records()
    logger = logging.getLogger("backchannel")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(seen)
    try:
        async with Hub(store, check_delivery=False) as hub:
            await hub.create_team("t", settings={"anchor_policy": "off"})
            await hub.add_member(
                "t", "w", delivery={"type": "webhook", "url": "http://127.0.0.1:9/"}
            )
            await hub.add_member(
                "t", "c", delivery={"type": "inbox-file", "root": str(tmp_path), "team": "cc"}
            )
            d = Dispatcher(hub, rescan_s=0.5, wait_s=0.5)
            bridge = InboxBridge(hub, rescan_s=0.5, root=tmp_path)
            await d.start()
            await bridge.start()
            try:
                start = len(seen.records)
                proxy.down()
                await asyncio.sleep(OUTAGE_S)  # the loops try again and again meanwhile
                during = seen.loud(start)
                shown = [r.getMessage() for r in during]
                assert not [r for r in during if r.exc_info], f"no traceback: {shown}"
                # each loop (the store's listener, the push scan, the two push members'
                # workers, the inbox watch, maintenance) says it once, however many
                # times it tried in those seconds
                loops = {m.split(" failed")[0].split(" lost")[0] for m in shown}
                assert len(loops) == len(shown) <= 6, f"one line per loop, not per try: {shown}"
                assert "scanning teams for push members" in loops, shown
                assert "listing teams for inbox files" in loops, shown
                for m in shown:
                    assert "\n" not in m and len(m) < 400, f"one short line: {m!r}"
                    assert store.url in m, f"names the store: {m}"
                    assert "retry shortly" in m or "check that" in m, f"the way out: {m}"
                proxy.up()
                back = len(seen.records)

                def said_back() -> list[str]:
                    return [
                        r.getMessage() for r in seen.loud(back) if "works again" in r.getMessage()
                    ]

                await eventually(
                    lambda: len(said_back()) >= 2,
                    within=30,
                    what="the push scan and the inbox watch to say they work again",
                    show=lambda: [r.getMessage() for r in seen.loud(back)],
                )
            finally:
                await bridge.stop()
                await d.stop()
    finally:
        logger.removeHandler(seen)
        logger.setLevel(old_level)
        proxy.down()
