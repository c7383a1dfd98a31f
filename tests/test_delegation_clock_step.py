"""A delegation's deadline keeps its length by the boot clock when the wall clock steps.

The deadline job moves with a step (as every timer does), and so must the delegation's
own ``deadline``: the task sent to another hub carries the time left (``timeout_s``), an
A2A call gives up some time after it, and the record shows it. Left on the old clock, a
step forward sent the task with a second to run, and a step back an hour more than the
caller asked for."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from backchannel.callbacks import CallbackConfig, Service
from backchannel.hub import Hub
from backchannel.stores.base import Store
from backchannel.types import DelegationState
from tests.test_delegation import FAST, SECRET
from tests.test_maintenance import _database_steps_too, _OffsetClock


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["forward", "back"])
async def test_a_clock_step_moves_a_pending_delegations_deadline_with_it(
    make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    """lead delegates to another hub with 600 s to run, and the wall clock steps an hour
    (the boot clock does not move) before its turn ends and the task goes out: the
    delegation still has about 600 s, in its record and in the task the other hub gets,
    and does not time out at the next pass."""
    clock = _OffsetClock(0.0)
    services = {"hub-b": Service("hub-b", "http://127.0.0.1:9")}
    cfg = CallbackConfig(secret=SECRET, services=services, retry=FAST)
    async with Hub(make_store(), clock=clock, background=False, callbacks=cfg) as hub:
        _database_steps_too(hub, clock, monkeypatch)
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "lead")
        await hub.open_session("t", "lead", "lead-s")
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate(
            "t", "lead", "lead-s", "worker@hub-b", "count", timeout_s=600, tool_use_id="tu_c"
        )
        await hub.maintain()

        clock.offset += step  # the wall clock is stepped an hour
        await hub.maintain()
        assert not hub.maintenance.skewed
        got = await hub.get_delegation("t", d.delegation_id)
        assert got.state is DelegationState.PENDING, got.error
        assert 590 < got.deadline - clock.now() <= 600, got.deadline - clock.now()
        assert got.deadline - got.created_at == pytest.approx(600)

        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")  # the task goes out
        [job] = await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox"))
        assert 590 < job.payload["body"]["timeout_s"] <= 600, job.payload["body"]
