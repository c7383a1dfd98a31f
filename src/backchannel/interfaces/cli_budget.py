"""``backchannel budget list|extend``: see and extend conversation budgets.

Extending needs the admin token (the default on the hub's host) or the team's ``user``
token: a human decides whether two agents, or a chain, may go on.
"""

from __future__ import annotations

from typing import Annotated

import typer

from backchannel.interfaces.cli import _client, _print_json, _run, _with
from backchannel.interfaces.cli_options import HomeOpt, JsonOpt, TokenOpt, UrlOpt

budget_app = typer.Typer(
    help="See and extend conversation budgets (per pair of members and per chain).",
    no_args_is_help=True,
)


@budget_app.command("list")
def budget_list(
    team: str,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the team's used budgets: `pair:a|b` (exchanges in the window) and chains."""
    client = _client(url, token, home, admin=token is None)
    budgets = _run(_with(client, lambda c: c.budgets(team)))
    if as_json:
        _print_json(budgets)
        return
    for b in budgets:
        state = "SPENT" if b["spent"] else "ok"
        print(f"{b['key']}\t{b['used']}/{b['limit']}\t{state}")


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
