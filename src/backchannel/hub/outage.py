"""How a background loop speaks of a store it cannot reach.

A hub's loops (push scanning, delivery workers, inbox-file watching, maintenance) call
the store every second or so. While the store is away (PostgreSQL stopped, a SQLite file
made unreadable) every call fails; logging each failure with its traceback fills the log
with the same story twice a second and buries what else happened. :class:`Outage` keeps
one loop's account: the first failure is one short line (a :class:`.StoreError` names
the store and the way out), the failures after it are quiet while the pause before the
next try doubles up to a cap, and the first success says once that the loop works
again. A failure that is not the store's (a bug) keeps its traceback, once.
"""

from __future__ import annotations

import logging

from backchannel.errors import BackchannelError, StoreError

__all__ = ["Outage"]


class Outage:
    """One loop's store failures: :meth:`failed` on each (it returns the pause before
    the next try), :meth:`ok` after each success. ``what`` names the loop's work in
    the log ("scanning teams for push members")."""

    def __init__(
        self, log: logging.Logger, what: str, *, first: float = 0.5, cap: float = 30.0
    ) -> None:
        self.log, self.what, self.first, self.cap = log, what, first, cap
        self.failures = 0
        self.pause = first

    @property
    def down(self) -> bool:
        """Whether the last try failed."""
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        """Account for a failed try: said once per outage; the pause to wait before the
        next try, doubled each time from ``first`` up to ``cap``."""
        self.failures += 1
        if self.failures == 1:
            self.pause = self.first
            if isinstance(exc, StoreError):
                self.log.warning(
                    "%s failed: %s (trying again quietly, less often, until it works)",
                    self.what,
                    exc.message,
                )
            elif isinstance(exc, BackchannelError):
                self.log.warning(
                    "%s failed: %s (trying again quietly until it works)", self.what, exc.message
                )
            else:
                self.log.error(
                    "%s failed (trying again quietly until it works)", self.what, exc_info=exc
                )
        else:
            self.pause = min(self.pause * 2, self.cap)
            self.log.debug("%s failed again (%d times): %s", self.what, self.failures, exc)
        return self.pause

    def ok(self) -> None:
        """Account for a try that worked: after failures, said once."""
        if self.failures:
            self.log.warning("%s works again after %d failed tries", self.what, self.failures)
        self.failures = 0
        self.pause = self.first
