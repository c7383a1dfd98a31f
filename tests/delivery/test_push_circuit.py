"""A push target down for good: the member's circuit (backchannel.delivery.circuit).

Real sockets on 127.0.0.1 (a port that refuses, an HTTP server that hangs until told to
answer), a real in-process hub and the real dispatcher; every wait is a condition with a
deadline."""

from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    state_of,
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


class _Reserved:
    """A local port held bound but not listening (every connection is refused) until
    :meth:`serve` starts an HTTP server on it that answers 200 and records, in order,
    the message ids it was given: a push target that is down, then comes back."""

    def __init__(self) -> None:
        self.holder = socket.socket()
        self.holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.holder.bind(("127.0.0.1", 0))
        self.port = self.holder.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: list[str] = []
        self.server: ThreadingHTTPServer | None = None

    def serve(self) -> None:
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                seen.append(self.headers["x-backchannel-message-id"])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.holder.close()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self.holder.close()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


async def _shown(hub: Hub, member: str) -> tuple[Any, Any, Any]:
    """The member's push circuit as ``hub`` shows it: its member list, its dashboard and
    its ``backchannel_push_down`` metric."""
    members = await MemberApi(hub, await hub.get_member("t", "user")).members()
    listed = next(m for m in members.members if m.name == member).push_circuit
    dashboard = {m["name"]: m for m in await members_view(hub, "t")}[member].get("push_circuit")
    metric = (await snapshot(hub)).get_sample_value(
        "backchannel_push_down", {"team": "t", "member": member}
    )
    return listed, dashboard, metric


async def test_every_hub_on_the_store_warns_shows_and_keeps_a_down_circuit(
    stores: tuple[Store, Store],
) -> None:
    # two hubs on one store (memory, one SQLite file, one PostgreSQL database) and a real
    # refusing port: hub a owns p's push and finds the target down; a send through hub b
    # is warned and b shows it; a stops, b takes p over and keeps probing (no full tries
    # for the next message); the target comes back, b's probe closes the circuit, and
    # what is sent through either hub goes out in order, each once
    target = _Reserved()
    try:
        callbacks = CallbackConfig(services={"bot": Service("bot", target.url)}, retry=QUICK)
        a = Hub(stores[0], callbacks=callbacks, max_attempts=3, check_delivery=False)
        b = Hub(stores[1], callbacks=callbacks, max_attempts=3, check_delivery=False)
        async with a, b:
            await a.create_team("t", settings={"anchor_policy": "off"})
            await a.add_member("t", "p", delivery=HOOK)
            # scans only when called; a never probes within the test, b soon
            common: dict[str, Any] = {"ownership_s": 1000.0, "rescan_s": 1000.0, "wait_s": 0.2}
            da = Dispatcher(a, owner="a", probe_start_s=1000.0, probe_max_s=1000.0, **common)
            db = Dispatcher(b, owner="b", probe_start_s=0.2, probe_max_s=0.4, **common)
            await da.start()
            await db.start()  # a holds p: b runs no worker for it
            try:
                assert [s.member for s in da.status()] == ["p"] and db.status() == []
                first = [
                    (await a.send("t", "user", "p", f"m{i}", link=False)).message_id
                    for i in range(3)
                ]
                states = [await wait_state(a, "t", mid, "dead") for mid in first]
                assert states[0].history[-1].detail.startswith("gave up after 3 attempt(s)")

                # a send through b, which does not push to p, is warned
                waiting = await b.send("t", "user", "p", "waits for the probe", link=False)
                assert any("push delivery to 'p' is down" in w for w in waiting.warnings)
                listed, dashboard, metric = await _shown(b, "p")
                assert listed is not None and listed.state == "down"
                assert listed.target == "webhook to service 'bot'/backchannel/deliver"
                assert dashboard is not None and dashboard["state"] == "down"
                assert metric == 1

                # a stops (gives p up at once); b takes p over from the stored circuit
                await da.stop()
                await db.rescan()
                await eventually(
                    lambda: [s.circuit for s in db.status()] == ["down"],
                    what="b to start from the stored circuit",
                )
                # the waiting message is b's probe: one try, not three, then dead with
                # the down reason; the probe count is stored for every hub to see
                st = await wait_state(b, "t", waiting.message_id, "dead")
                assert st.history[-1].detail.startswith("push delivery to 'p' is down")
                listed, _, _ = await _shown(a, "p")
                assert listed is not None and listed.probes >= 1
                queued = await a.send("t", "user", "p", "warned through a", link=False)
                assert any("push delivery to 'p' is down" in w for w in queued.warnings)
                await wait_state(b, "t", queued.message_id, "dead")

                # the target comes back: the next probe closes the circuit on b, and
                # what follows (sent through both hubs) goes out in order, each once
                target.serve()
                later = [
                    (await (a if i % 2 else b).send("t", "user", "p", f"n{i}", link=False))
                    for i in range(4)
                ]
                for sent in later:
                    await wait_state(b, "t", sent.message_id, "acked")
                assert [s.circuit for s in db.status()] == ["up"]  # closed by b's probe
                for hub in (a, b):
                    assert await _shown(hub, "p") == (None, None, None)
                    await hub.push_circuits.refresh(0)
                    assert (await hub.send("t", "user", "p", "up", link=False)).warnings == ()
            finally:
                await da.stop()
                await db.stop()
            assert await a.store.read(lambda tx: tx.push_circuits()) == []
    finally:
        target.close()
    ids = [sent.message_id for sent in later]
    assert [m for m in target.seen if m in ids] == ids
    assert len(target.seen) == len(set(target.seen)), "nothing pushed twice"
    assert not {*first, waiting.message_id, queued.message_id} & set(target.seen)


async def test_a_stored_circuit_goes_with_the_delivery_setting_member_and_team(
    stores: tuple[Store, Store],
) -> None:
    # a circuit is about one target: changing the member's delivery setting forgets it
    # (changing its other settings does not), and so does removing the member or team
    state = {"state": "down", "target": "webhook to service 'bot'", "reason": "refused"}
    async with Hub(stores[0], check_delivery=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "p", delivery=HOOK)
        await hub.add_member("t", "q", delivery=HOOK)

        async def down(member: str) -> None:
            await hub.store.transact(lambda tx: tx.set_push_circuit("t", member, state))

        async def stored() -> list[str]:
            return [m for _, m, _ in await hub.store.read(lambda tx: tx.push_circuits())]

        await down("p")
        await down("q")
        assert await hub.store.read(lambda tx: tx.push_circuit("t", "p")) == state
        await hub.update_member("t", "p", settings={"note": "kept"})
        assert await stored() == ["p", "q"]
        await hub.update_member("t", "p", delivery={**HOOK, "service": "other"})
        assert await stored() == ["q"]
        await hub.remove_member("t", "q")
        assert await stored() == []
        await down("p")
        await hub.remove_team("t")
        assert await stored() == []


async def test_a_probe_failing_after_the_delivery_setting_changed_leaves_no_stale_circuit() -> None:
    # the member's delivery changes (to pull) while its worker's probe of the down target
    # is in flight, and the probe fails before the hub's next scan retires the worker:
    # the change forgot the stored circuit, and the failed probe must not store it again
    # (it would stay for good: no worker for a pull member ever closes it, and every hub
    # would warn the member's senders of a push that is down)
    def behaviour(req: Seen, n: int) -> tuple[int, bytes, dict[str, str]]:
        ep.release.wait(10)  # hangs past the attempt timeout: the target is down
        return 503, b"", {}

    with endpoint(behaviour) as ep:
        async with running_hub({"bot": ep.url}, retry=QUICK, max_attempts=3) as hub:
            await hub.add_member("t", "a", delivery=HOOK)
            first = (await hub.send("t", "user", "a", "m0", link=False)).message_id
            # scans only when called: the worker runs on with its old setting meanwhile
            async with dispatching(hub, rescan_s=1000.0, probe_start_s=0.2) as d:
                await wait_state(hub, "t", first, "dead")
                probe = (await hub.send("t", "user", "a", "probe", link=False)).message_id
                await eventually(
                    lambda: any(s.headers["x-backchannel-message-id"] == probe for s in ep.seen),
                    what="the probe in flight",
                )
                await hub.update_member("t", "a", delivery={"type": "pull"})
                assert await hub.store.read(lambda tx: tx.push_circuit("t", "a")) is None
                # the probe fails: the worker finds the setting changed and stops, giving
                # the probe back to the queue (it is the puller's now, not dead)
                await eventually(
                    lambda: [s.state for s in d.status()] == ["stopped"],
                    what="the old worker stopped",
                )
                assert await state_of(hub, "t", probe) == "queued"
                await d.rescan()
                assert d.status() == []
            assert await hub.store.read(lambda tx: tx.push_circuit("t", "a")) is None
            await hub.push_circuits.refresh(0)
            assert hub.push_circuits.get("t", "a") is None
            assert (await hub.send("t", "user", "a", "pulled", link=False)).warnings == ()
            got = await hub.receive("t", "a", wait=0.0)
            assert [g.message.text for g in got] == ["probe", "pulled"]


async def test_a_hub_dying_as_it_dead_letters_the_copy_that_opens_the_circuit_leaves_it_stored(
    stores: tuple[Store, Store],
) -> None:
    # hub a gives the head copy up after its tries (the target hangs) and dies right
    # after that commits, as a kill -9 there leaves it: no later write of a's happens.
    # Hub b takes p over when a's lease runs out and must find the circuit stored, so
    # the copies queued behind get one probe, not each their whole tries again
    def behaviour(req: Seen, n: int) -> tuple[int, bytes, dict[str, str]]:
        ep.release.wait(10)  # hangs past the attempt timeout: the target is down
        return 503, b"", {}

    with endpoint(behaviour) as ep:

        def tries(mid: str) -> int:
            return sum(s.headers["x-backchannel-message-id"] == mid for s in ep.seen)

        callbacks = CallbackConfig(services={"bot": Service("bot", ep.url)}, retry=QUICK)
        a = Hub(stores[0], callbacks=callbacks, max_attempts=3, check_delivery=False)
        b = Hub(stores[1], callbacks=callbacks, max_attempts=3, check_delivery=False)
        async with a, b:
            await a.create_team("t", settings={"anchor_policy": "off"})
            await a.add_member("t", "p", delivery=HOOK)
            dead = asyncio.Event()
            given_up = a.give_up

            async def give_up_then_die(*args: Any, **kw: Any) -> bool:
                done = await given_up(*args, **kw)
                for loop in (da._scan_task, da._renew_task):
                    if loop is not None:
                        loop.cancel()  # no renewal of a's lease from now on
                dead.set()
                await asyncio.Event().wait()  # a's worker never gets further
                return done

            a.give_up = give_up_then_die  # type: ignore[method-assign]
            common: dict[str, Any] = {"ownership_s": 1.0, "wait_s": 0.2, "probe_start_s": 0.2}
            da = Dispatcher(a, owner="a", rescan_s=0.1, **common)
            await da.start()
            db: Dispatcher | None = None
            try:
                ids = [
                    (await a.send("t", "user", "p", f"m{i}", link=False)).message_id
                    for i in range(4)
                ]
                await eventually(dead.is_set, what="a to give the head up and die", within=10)
                db = Dispatcher(b, owner="b", rescan_s=0.1, probe_max_s=0.4, **common)
                await db.start()
                for mid in ids:
                    await wait_state(b, "t", mid, "dead")
            finally:
                for w in list(da._workers.values()):
                    w.task.cancel()  # what the kill did to a's worker
                a.give_up = given_up  # type: ignore[method-assign]
                await da.stop()
                if db is not None:
                    await db.stop()
        assert tries(ids[0]) == 3
        # b started from the stored circuit: m1 was its probe, m2 and m3 not tried
        assert [tries(m) for m in ids[1:]] == [1, 0, 0]
