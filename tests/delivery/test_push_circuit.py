"""A push target down for good: the member's circuit (backchannel.delivery.circuit).

Real sockets on 127.0.0.1 (a port that refuses, an HTTP server that hangs until told to
answer), a real in-process hub and the real dispatcher; every wait is a condition with a
deadline."""

from __future__ import annotations

import socket
import threading
from typing import Any

from backchannel.callbacks import CallbackConfig, Service
from backchannel.client import Client
from backchannel.core.delegation import RetryPolicy
from backchannel.delivery.dispatcher import Dispatcher
from backchannel.hub import Hub
from backchannel.interfaces import mcp
from backchannel.interfaces.dashboard import members_view
from backchannel.interfaces.metrics import snapshot
from backchannel.member import MemberApi
from backchannel.stores.base import Store
from backchannel.testing import eventually
from tests.delivery import test_dispatch_ownership as ownership
from tests.delivery.conftest_adapters import (
    Seen,
    answer,
    dispatching,
    endpoint,
    running_hub,
    wait_state,
)

#: one store seen by two hubs (memory, one SQLite file, one PostgreSQL database)
stores = ownership.stores

#: a short attempt timeout, so a hanging target costs a fraction of a second a try
QUICK = RetryPolicy(start=0.05, factor=2.0, cap=0.2, budget=10.0, timeout=0.3)
HOOK = {"type": "webhook", "service": "bot"}


def _refusing_url() -> str:
    """A local port nothing listens on: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_messages_queued_behind_a_refusing_target_are_dead_lettered_at_once() -> None:
    # max_attempts 3: the head gets its three tries; the nine queued behind it must not
    # each get three more (at the default policy that is 15 s a message)
    async with running_hub({"bot": _refusing_url()}, retry=QUICK, max_attempts=3) as hub:
        await hub.add_member("t", "a", delivery=HOOK)
        ids = [
            (await hub.send("t", "user", "a", f"m{i}", link=False)).message_id for i in range(10)
        ]
        async with dispatching(hub) as d:
            states = [await wait_state(hub, "t", mid, "dead") for mid in ids]
            assert d.status()[0].circuit == "down"
    head, *rest = states
    assert head.history[-1].detail.startswith("gave up after 3 attempt(s)")
    assert "ConnectError" in head.history[-1].detail
    for st in rest:
        reason = st.history[-1].detail  # given up without tries of its own
        assert "not tried on its own" in reason
        assert "push delivery to 'a' is down" in reason
        assert "webhook to service 'bot'" in reason  # names the target
        assert "Send it again once the target is back" in reason  # and the way out


async def test_a_hanging_target_is_probed_and_delivery_resumes_in_order_once_it_answers() -> None:
    down = threading.Event()
    down.set()

    def behaviour(req: Seen, n: int) -> tuple[int, bytes, dict[str, str]]:
        if down.is_set():
            ep.release.wait(10)  # hangs past the attempt timeout
            return 503, b"", {}
        return 200, b"", {}

    with endpoint(behaviour) as ep:

        def tries(mid: str) -> int:
            return sum(s.headers["x-backchannel-message-id"] == mid for s in ep.seen)

        async with running_hub({"bot": ep.url}, retry=QUICK, max_attempts=3) as hub:
            await hub.add_member("t", "a", delivery=HOOK)
            _, lead_token = await hub.add_member("t", "lead")
            ids = [
                (await hub.send("t", "user", "a", f"m{i}", link=False)).message_id for i in range(5)
            ]
            async with dispatching(hub, probe_start_s=0.2, probe_max_s=0.4) as d:
                for mid in ids:
                    await wait_state(hub, "t", mid, "dead")
                assert tries(ids[0]) == 3
                assert [tries(m) for m in ids[1:]] == [0, 0, 0, 0]

                # the circuit is visible: the member's record, the worker's status
                members = await MemberApi(hub, await hub.get_member("t", "user")).members()
                circuit = next(m for m in members.members if m.name == "a").push_circuit
                assert circuit is not None and circuit.state == "down"
                assert "timed out" in circuit.reason
                assert d.status()[0].circuit == "down"
                shown = {m["name"]: m for m in await members_view(hub, "t")}
                assert shown["a"]["push_circuit"]["state"] == "down"  # the dashboard
                assert "push_circuit" not in shown["lead"]
                metric = (await snapshot(hub)).get_sample_value(
                    "backchannel_push_down", {"team": "t", "member": "a"}
                )
                assert metric == 1

                # a new send is taken, with a warning; it is the probe: one try, then
                # dead-lettered while the target still hangs
                sent = await hub.send("t", "user", "a", "probe", link=False)
                assert any("push delivery to 'a' is down" in w for w in sent.warnings)
                await wait_state(hub, "t", sent.message_id, "dead")
                assert tries(sent.message_id) == 1
                # an agent sending through its MCP tool is told too
                async with Client.local(hub, lead_token) as lead:
                    text, data = await mcp._send(
                        mcp.Agent(lead, "t", "lead"), mcp.SendArgs(to="a", message="from the lead")
                    )
                assert "Warning: push delivery to 'a' is down" in text
                assert data["warnings"]
                await wait_state(hub, "t", data["message_id"], "dead")

                # the target answers again: the next message closes the circuit and the
                # rest follow in order, each once
                down.clear()
                later = [
                    (await hub.send("t", "user", "a", f"n{i}", link=False)).message_id
                    for i in range(3)
                ]
                for mid in later:
                    await wait_state(hub, "t", mid, "acked")
                await eventually(
                    lambda: hub.push_circuits.get("t", "a") is None, what="the circuit closed"
                )
                assert d.status()[0].circuit == "up"
            delivered = [
                s.headers["x-backchannel-message-id"]
                for s in ep.seen
                if s.headers["x-backchannel-message-id"] in later
            ]
            assert delivered == later
            again = await hub.send("t", "user", "a", "after", link=False)
            assert again.warnings == ()


async def test_a_refusal_of_the_message_does_not_mark_the_target_down() -> None:
    with endpoint(answer(400, b"bad message")) as ep:
        async with running_hub({"bot": ep.url}, retry=QUICK, max_attempts=3) as hub:
            await hub.add_member("t", "a", delivery=HOOK)
            ids = [
                (await hub.send("t", "user", "a", f"m{i}", link=False)).message_id for i in range(3)
            ]
            async with dispatching(hub) as d:
                for mid in ids:
                    await wait_state(hub, "t", mid, "dead")
                assert d.status()[0].circuit == "up"
            assert ep.count() == 3  # each message was tried: the target answered
            assert hub.push_circuits.get("t", "a") is None


async def test_a_hub_that_takes_the_member_over_starts_with_the_circuit_closed(
    stores: tuple[Store, Store],
) -> None:
    # two hubs on one store (memory, one SQLite file, one PostgreSQL database): hub a
    # finds the target down; it comes back, a stops, and b, which takes the member over,
    # delivers what waited, in order, each once; a forgets the circuit it held
    down = threading.Event()
    down.set()

    def behaviour(req: Seen, n: int) -> tuple[int, bytes, dict[str, str]]:
        if down.is_set():
            ep.release.wait(10)
        return 200, b"", {}

    with endpoint(behaviour) as ep:

        def tries(mid: str) -> int:
            return sum(s.headers["x-backchannel-message-id"] == mid for s in ep.seen)

        callbacks = CallbackConfig(services={"bot": Service("bot", ep.url)}, retry=QUICK)
        a = Hub(stores[0], callbacks=callbacks, max_attempts=3, check_delivery=False)
        b = Hub(stores[1], callbacks=callbacks, max_attempts=3, check_delivery=False)
        async with a, b:
            await a.create_team("t", settings={"anchor_policy": "off"})
            await a.add_member("t", "p", delivery=HOOK)
            # scans only when called, and no probe on a within the test
            common: dict[str, Any] = {"ownership_s": 1000.0, "rescan_s": 1000.0, "wait_s": 0.2}
            da = Dispatcher(a, owner="a", probe_start_s=1000.0, probe_max_s=1000.0, **common)
            db = Dispatcher(b, owner="b", **common)
            await da.start()
            await db.start()
            try:
                ids = [
                    (await a.send("t", "user", "p", f"m{i}", link=False)).message_id
                    for i in range(3)
                ]
                for mid in ids:
                    await wait_state(a, "t", mid, "dead")
                assert a.push_circuits.get("t", "p") is not None
                waiting = await a.send("t", "user", "p", "waits for the probe", link=False)
                assert waiting.warnings
                down.clear()
                await da.stop()  # hands p over at once
                assert a.push_circuits.get("t", "p") is None
                await db.rescan()
                later = [waiting.message_id] + [
                    (await b.send("t", "user", "p", f"n{i}", link=False)).message_id
                    for i in range(2)
                ]
                for mid in later:
                    await wait_state(b, "t", mid, "acked")
                assert b.push_circuits.get("t", "p") is None
            finally:
                await da.stop()
                await db.stop()
        assert [tries(m) for m in ids] == [3, 0, 0]
        assert [tries(m) for m in later] == [1, 1, 1]
        order = [s.headers["x-backchannel-message-id"] for s in ep.seen]
        assert [m for m in order if m in later] == later
