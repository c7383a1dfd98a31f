"""What ``backchannel.testing`` gives users for their own tests works as promised."""

from __future__ import annotations

import pytest

from backchannel.testing import eventually, eventually_blocking


async def test_eventually_returns_the_first_truthy_value_of_a_sync_or_async_check() -> None:
    calls = []

    def sync_check() -> list[int]:
        calls.append(1)
        return calls if len(calls) >= 3 else []

    assert await eventually(sync_check, what="three calls") == [1, 1, 1]

    async def async_check() -> str:
        return "ready"

    assert await eventually(async_check, what="ready") == "ready"


async def test_eventually_names_what_it_waited_for_and_what_it_last_saw() -> None:
    with pytest.raises(AssertionError) as caught:
        await eventually(lambda: 0, what="m1 acked", within=0.05)
    message = str(caught.value)
    assert "waiting for m1 acked" in message
    assert "last returned 0" in message


def test_eventually_blocking_is_the_same_loop_without_an_event_loop() -> None:
    seen = iter([None, "", "done"])
    assert eventually_blocking(lambda: next(seen), what="done") == "done"
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for x; .* \[\]"):
        eventually_blocking(list, what="x", within=0.05)
