"""``backchannel budget list|extend``: see and extend conversation budgets.

Extending needs the admin token (the default on the hub's host) or the team's ``user``
token: a human decides whether two agents, or a chain, may go on.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from backchannel.client import Client, HttpClient, LocalClient
from backchannel.interfaces.cli import _client, _print_json, _run, _with
from backchannel.interfaces.cli_options import HomeOpt, JsonOpt, TokenOpt, UrlOpt

budget_app = typer.Typer(
    help="See and extend conversation budgets (per pair of members and per chain).",
    no_args_is_help=True,
)


def _local(c: Client) -> LocalClient:
    assert isinstance(c, LocalClient)
    return c


@budget_app.command("list")
def budget_list(
    team: str,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the team's used budgets: `pair:a|b` (exchanges in the window) and chains."""

    async def run(c: Client) -> list[dict[str, Any]]:
        if isinstance(c, HttpClient):
            data = await c._call("GET", f"/v1/teams/{quote(team, safe='')}/budgets")
            return list(data["budgets"])
        return await _local(c).hub.list_budgets(team)

    budgets = _run(_with(_client(url, token, home, admin=token is None), run))
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

    async def run(c: Client) -> dict[str, Any]:
        if isinstance(c, HttpClient):
            path = f"/v1/teams/{quote(team, safe='')}/budgets/extend"
            result: dict[str, Any] = await c._call("POST", path, json={"key": key, "by": by})
            return result
        local = _local(c)
        who = "admin" if local._me is None else local._me.name
        return await local.hub.extend_budget(team, key, by, by_whom=who)

    _print_json(_run(_with(_client(url, token, home, admin=token is None), run)))


def register(app: typer.Typer) -> None:
    app.add_typer(budget_app, name="budget")
