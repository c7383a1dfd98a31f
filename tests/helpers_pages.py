"""What every paged list's SDK call must do, checked once for each list."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from backchannel import errors


async def check_sdk_pages(
    listing: Callable[..., Awaitable[list[Any]]],
    pages: Callable[..., AsyncIterator[Any]],
    items: str,
    key: Callable[[Any], str],
    ids: list[str],
    page: int,
) -> None:
    """``listing`` (the SDK's list call) gives a page, the page after a cursor, and every
    item (``ids``, in order, more than ``page``) when no limit is given; ``pages`` (its
    ``*_pages`` iterator) stops at the limit, naming where the next page starts; bad
    limits and cursors are refused naming the field, before the hub is asked."""
    assert [key(x) for x in await listing(limit=3)] == ids[:3]
    assert [key(x) for x in await listing(after=ids[1], limit=2)] == ids[2:4]
    assert [key(x) for x in await listing()] == ids  # page by page
    got = [p async for p in pages(limit=page + 2)]
    assert [len(getattr(p, items)) for p in got] == [page + 2]
    assert got[-1].next_after == ids[page + 1]
    for bad in ({"limit": 0}, {"limit": -5}, {"after": ""}):
        with pytest.raises(errors.InvalidRequest) as caught:
            await listing(**bad)
        assert caught.value.details["field"] == next(iter(bad))
