"""The options every CLI command module shares, declared once."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:  # the click typer carries (and hands its groups)
    from typer import _click

__all__ = [
    "AsOpt",
    "HomeOpt",
    "JsonOpt",
    "MemberTokenOpt",
    "TokenOpt",
    "UrlOpt",
    "WholeHelpGroup",
    "choice",
    "finite",
]


class WholeHelpGroup(TyperGroup):
    """A command group whose ``-h`` lists each command with its whole first sentence
    (wrapped to the terminal), not cut at about 60 columns with "...": "Run the hub:
    HTTP API, live streams and the data..." told a newcomer less than the command does."""

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=1_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def finite(value: float | None) -> float | None:
    """The callback of every number option: ``nan`` and ``inf`` parse as floats but are
    no number of seconds, minutes or days."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, not {value}")
    return value


def choice(
    values: Iterable[str] | Callable[[], Iterable[str]],
) -> Callable[[str | None], str | None]:
    """The callback of an option or argument with a closed set of values (given, or made
    on first use by a function: a module the command may not load otherwise): another
    value is a usage error (exit 2) that names the option and the values it takes, before
    anything is asked of the hub (whose refusal was a validation error, exit 1)."""

    def check(value: str | None) -> str | None:
        allowed = [str(v) for v in (values if isinstance(values, Iterable) else values())]
        if value is None or value in allowed:
            return value
        from backchannel.core.messages import suggest

        near = suggest(value, allowed)
        hint = f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""
        raise typer.BadParameter(f"{value!r} is not one of: {', '.join(allowed)}{hint}")

    return check


UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        "--store",
        envvar="BACKCHANNEL_URL",
        help="Hub URL (http://...) or store URL (sqlite:///path, postgresql://...).",
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="BACKCHANNEL_TOKEN", help="Member or admin token."),
]
MemberTokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="BACKCHANNEL_TOKEN", help="Your member token."),
]
HomeOpt = Annotated[
    Path | None,
    typer.Option("--home", envvar="BACKCHANNEL_HOME", help="Data directory [./.backchannel]."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
AsOpt = Annotated[
    str | None,
    typer.Option("--as", help="TEAM/MEMBER this agent is attached as; other tokens are refused."),
]
