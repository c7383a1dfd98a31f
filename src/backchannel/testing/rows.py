"""Count the records a store hands out, to test that a read costs what it shows.

:func:`counting_rows` wraps a store's ``read`` and ``transact`` so every transaction
sees its ``Tx`` through a proxy that counts the records each call returns (the items of
a returned list, dict or tuple of lists), by type. Not a timing: a test asserts that a
read of a team with ten thousand sessions takes as many as one with twenty.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from backchannel.stores.base import Store, Tx

__all__ = ["RowCount", "counting_rows"]

T = TypeVar("T")


class RowCount(Counter[str]):
    """Records handed out, by type name (``"Session"``, ``"Link"``, ...)."""

    def add(self, value: object) -> None:
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, (list, tuple, dict)):
                    self.add(item)
                elif item is not None and not isinstance(item, (int, float, str, bool)):
                    self[type(item).__name__] += 1
        elif value is not None and not isinstance(value, (int, float, str, bool)):
            self[type(value).__name__] += 1


class _CountingTx:
    def __init__(self, tx: Tx, count: RowCount) -> None:
        self._tx, self._count = tx, count

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._tx, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            self._count.add(out)
            return out

        return call


@contextlib.contextmanager
def counting_rows(store: Store) -> Iterator[RowCount]:
    """While open, count what ``store``'s transactions read (see the module docstring)."""
    count = RowCount()
    read, transact = store.read, store.transact

    def wrap(run: Callable[[Callable[[Tx], T]], Awaitable[T]]) -> Any:
        def counted(fn: Callable[[Tx], T]) -> Awaitable[T]:
            return run(lambda tx: fn(_CountingTx(tx, count)))

        return counted

    store.read = wrap(read)  # type: ignore[method-assign]
    store.transact = wrap(transact)  # type: ignore[method-assign]
    try:
        yield count
    finally:
        del store.read, store.transact  # the class's own again
