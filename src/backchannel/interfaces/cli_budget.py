"""``backchannel budget list|extend``: see and extend conversation budgets.

Extending needs the admin token (the default on the hub's host) or the team's ``user``
token: a human decides whether two agents, or a chain, may go on.
"""

from __future__ import annotations

import shlex
from typing import Annotated

import typer

from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.interfaces.cli import _client, _page, _print_json, _run, _with, err
from backchannel.interfaces.cli_options import HomeOpt, JsonOpt, TokenOpt, UrlOpt, WholeHelpGroup
from backchannel.interfaces.terminal import printable as _p

budget_app = typer.Typer(
    help="List and extend conversation budgets (per pair of members and per chain).",
    no_args_is_help=True,
    cls=WholeHelpGroup,
)


@budget_app.command("list")
def budget_list(
    team: str,
    after: Annotated[
        str | None,
        typer.Option(help="Only budgets whose key comes after this one (the last shown)."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_PAGE, help="Show at most this many.")] = PAGE,
    every: Annotated[
        bool, typer.Option("--all", help="Every one, read from the hub a page at a time.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the team's used budgets: `pair:a|b` (exchanges in the window) and chains; by
    key, a page at a time (the next page's command is printed on stderr when there are
    more; --all shows them all)."""
    client = _client(url, token, home, admin=token is None)
    # one more than shown: whether more follow is said, never left for the reader to guess
    budgets = _run(
        _with(client, lambda c: c.budgets(team, after=after, limit=None if every else limit + 1))
    )
    budgets = _page(
        budgets,
        limit=limit,
        every=every,
        what="budgets",
        again=lambda last: f"backchannel budget list {team} --after {shlex.quote(last['key'])}",
        as_json=as_json,
    )
    if as_json:
        return
    for b in budgets:
        state = "SPENT" if b["spent"] else "ok"
        print("\t".join(_p(c) for c in (b["key"], f"{b['used']}/{b['limit']}", state)))
    if not budgets:
        err.print("no budgets used")


@budget_app.command("extend")
def budget_extend(
    team: str,
    key: Annotated[str, typer.Argument(help="'pair:<a>|<b>' or 'chain:<chain_id>'")],
    by: Annotated[int, typer.Option("--by", help="How many more exchanges (or hops).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Let exactly BY more exchanges (a pair) or hops (a chain) through."""
    client = _client(url, token, home, admin=token is None)
    _print_json(_run(_with(client, lambda c: c.extend_budget(key, by, team=team))))


def register(app: typer.Typer) -> None:
    app.add_typer(budget_app, name="budget")
