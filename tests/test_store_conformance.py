"""Every store passes the same conformance suite (backchannel.testing.STORE_CHECKS)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from backchannel.stores.base import Store
from backchannel.testing import STORE_CHECKS, StoreFactory


@pytest.mark.parametrize("check", STORE_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_store_contract(
    make_store: Callable[[], Store], check: Callable[[StoreFactory], Awaitable[None]]
) -> None:
    await check(make_store)
