"""Checks of member ``delivery`` settings, registered by whoever brings the adapters.

The hub stores a member's ``delivery`` setting but does not know the adapters that read
it: those live in :mod:`backchannel.delivery`, which uses the hub, never the other way
round. Where a hub is built together with its adapters (``backchannel serve``, a client
that opens a store itself, as the CLI does with no ``serve``), the adapters register
their check here (:func:`backchannel.delivery.adapters.register_checks`), and
``add_member`` and ``update_member`` refuse a setting no check accepts before anything
is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["DeliveryCheck", "DeliveryChecks", "DeliveryClash"]

#: Raises :class:`~backchannel.errors.InvalidRequest` for a setting it refuses.
DeliveryCheck = Callable[[Mapping[str, Any]], None]
#: ``(team, member, setting, others)``: raises :class:`~backchannel.errors.InvalidRequest`
#: when ``member``'s ``setting`` would deliver where one of the team's ``others`` (member
#: name to its delivery setting) already does. Runs in the store's transaction.
DeliveryClash = Callable[[str, str, Mapping[str, Any], Mapping[str, Mapping[str, Any]]], None]


class DeliveryChecks:
    """An ordered registry of delivery-setting checks; empty, it accepts every setting."""

    def __init__(self) -> None:
        self._checks: list[DeliveryCheck] = []
        self._clashes: list[DeliveryClash] = []

    def register(self, check: DeliveryCheck) -> None:
        """Add ``check`` (once; registering the same check again changes nothing)."""
        if check not in self._checks:
            self._checks.append(check)

    def register_clash(self, clash: DeliveryClash) -> None:
        """Add a check of a setting against the team's other members' (once)."""
        if clash not in self._clashes:
            self._clashes.append(clash)

    def __bool__(self) -> bool:
        return bool(self._checks or self._clashes)

    def clash(
        self,
        team: str,
        member: str,
        setting: Mapping[str, Any] | None,
        others: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """Run every registered clash check on a non-empty ``setting``."""
        if not setting:
            return
        for clash in self._clashes:
            clash(team, member, setting, others)

    def check(self, setting: Mapping[str, Any] | None) -> None:
        """Run every registered check on a non-empty ``setting``."""
        if not setting:
            return
        for check in self._checks:
            check(setting)
