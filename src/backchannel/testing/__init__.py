"""Fakes and conformance checks, shipped for users' tests as well as ours.

* :class:`FakeClock` — a clock that moves only when told to.
* :class:`MemoryStore` — the in-memory store (re-exported).
* :func:`check_store` — every guarantee of the :mod:`backchannel.stores.base` contract,
  run against a store factory. Each check is also in :data:`STORE_CHECKS`, so a test
  suite can parametrize over them and see one result per guarantee::

      @pytest.mark.parametrize("check", STORE_CHECKS, ids=lambda c: c.__name__)
      async def test_store_contract(make_store, check):
          await check(make_store)

* :class:`RecordingAdapter` — a push adapter that records what it is handed in a
  :class:`Recording`; :func:`check_adapter` — the delivery adapter contract, run against
  an adapter of yours.
* :class:`ScriptedModel` — the built-in runner's offline model: plays a policy (a
  function of a :class:`ScriptContext` returning :func:`say` or :func:`use` of tool
  :func:`call`\\ s) instead of calling a provider.
* :func:`counting_rows` — count the records a store's transactions read, by type, to
  test that a read costs what it shows rather than what the store holds.
* :func:`eventually` / :func:`eventually_blocking` — wait for observable state, naming
  what is awaited, instead of sleeping.
"""

from __future__ import annotations

from backchannel.runner.scripted import Policy, ScriptContext, ScriptedModel, call, say, use
from backchannel.stores.memory import MemoryStore
from backchannel.testing.adapters import Recording, RecordingAdapter, check_adapter
from backchannel.testing.clock import FakeClock
from backchannel.testing.rows import RowCount, counting_rows
from backchannel.testing.store_checks import STORE_CHECKS, StoreFactory, check_store
from backchannel.testing.waiting import eventually, eventually_blocking

__all__ = [
    "STORE_CHECKS",
    "FakeClock",
    "MemoryStore",
    "Policy",
    "Recording",
    "RecordingAdapter",
    "RowCount",
    "ScriptContext",
    "ScriptedModel",
    "StoreFactory",
    "call",
    "check_adapter",
    "check_store",
    "counting_rows",
    "eventually",
    "eventually_blocking",
    "say",
    "use",
]
