"""CLI commands for agent runtimes: ``hook``, ``mcp`` and ``attach``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the agent commands to the ``backchannel`` CLI."""
