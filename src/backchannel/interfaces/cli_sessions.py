"""CLI commands for sessions and for where a command goes: ``session open | list | event
| terminate``, ``init``, and ``status`` without a message id.

With these, a member can do from a shell what a runtime does over HTTP: open a session,
report a turn (``turn_start`` ... ``agent_stop``), set and read its timers
(``timer set --session``, ``inbox --session``) and see its links (``links``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import httpx
import typer

from backchannel import config
from backchannel.client import Client
from backchannel.client._transport import hub_request
from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.errors import BackchannelError
from backchannel.interfaces.cli_hub import Target
from backchannel.interfaces.cli_options import HomeOpt, JsonOpt, UrlOpt, WholeHelpGroup
from backchannel.interfaces.cli_options import MemberTokenOpt as TokenOpt
from backchannel.reach import not_the_hub, unanswered

EVENT_KINDS = ("turn_start", "thought", "tool_call", "tool_result", "agent_output", "agent_stop")

session_app = typer.Typer(
    help="Sessions: open one, report its turn's events, list, terminate.",
    rich_markup_mode=None,
    no_args_is_help=True,
    cls=WholeHelpGroup,
)


def _cli() -> ModuleType:
    # the main CLI module imports this one at its end; import it back lazily
    from backchannel.interfaces import cli

    return cli


def _as_member(url: str | None, token: str | None, home: Path | None, fn: Any) -> Any:
    cli = _cli()
    return cli._run(cli._with(cli._client(url, token, home, admin=False), fn))


@session_app.command("open")
def session_open(
    session_id: Annotated[
        str | None, typer.Argument(help="Resume this session [a new one, named by the hub].")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Open (or resume) a session of yours. Prints its id."""
    s = _as_member(url, token, home, lambda c: c.open_session(session_id))
    if as_json:
        _cli()._print_json(s)
        return
    _cli().err.print(f"session {s['session_id']} is {s['state']}", markup=False)
    print(s["session_id"])


@session_app.command("list")
def session_list(
    member: Annotated[str | None, typer.Option(help="Only this member's sessions.")] = None,
    active: Annotated[
        bool, typer.Option("--active", help="Only the sessions whose turn runs now.")
    ] = False,
    live: Annotated[
        bool, typer.Option("--live", help="Only the sessions that have not ended.")
    ] = False,
    after: Annotated[
        str | None,
        typer.Option(help="Only sessions opened after this session id (the last one shown)."),
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
    """Your team's sessions and their states, in the order they were opened, a page at a
    time (the next page's command is printed on stderr when there are more; --all shows
    them all)."""
    # one more than shown: whether more follow is said, never left for the reader to guess
    found: list[dict[str, Any]] = _as_member(
        url,
        token,
        home,
        lambda c: c.list_sessions(
            member,
            active_only=active,
            live_only=live,
            after=after,
            limit=None if every else limit + 1,
        ),
    )
    found = _cli()._page(
        found,
        limit=limit,
        every=every,
        what="sessions",
        again=lambda last: (
            f"backchannel session list --after {last['session_id']}"
            + (f" --member {member}" if member is not None else "")
            + (" --active" if active else "")
            + (" --live" if live else "")
        ),
        as_json=as_json,
    )
    if as_json:
        return
    for s in found:
        print(f"{s['session_id']}\t{s['member']}\t{s['state']}\tturn {s.get('turn', 0)}")
    if not found:
        _cli().err.print("no sessions")


@session_app.command("event")
def session_event(
    session_id: Annotated[str, typer.Argument(help="One of your sessions.")],
    kind: Annotated[str, typer.Argument(help=", ".join(EVENT_KINDS))],
    text: Annotated[
        str, typer.Argument(help="The event's text ('-' reads stdin); agent_stop's is routed.")
    ] = "",
    data: Annotated[str | None, typer.Option(help="A JSON object of extra data.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Report a turn's event: turn_start opens the turn, agent_stop ends it and routes its
    closing text (<message to="name">...</message> blocks, link crossings). Prints the
    hub's answer as JSON."""
    if kind not in EVENT_KINDS:
        raise typer.BadParameter(
            f"{kind!r} is not an event kind; use one of: {', '.join(EVENT_KINDS)}",
            param_hint="KIND",
        )
    if text == "-":
        text = _cli().read_stdin("TEXT")
    extra: dict[str, Any] | None = None
    if data is not None:
        try:
            extra = json.loads(data)
        except ValueError as exc:
            raise typer.BadParameter(f"not JSON ({exc})", param_hint="--data") from None
        if not isinstance(extra, dict):
            raise typer.BadParameter("must be a JSON object", param_hint="--data")
    answer = _as_member(url, token, home, lambda c: c.report_event(session_id, kind, text, extra))
    _cli()._print_json(answer)


@session_app.command("terminate")
def session_terminate(
    session_id: Annotated[str, typer.Argument(help="One of your sessions.")],
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """End a session: its links close and its timers are cancelled."""
    s = _as_member(url, token, home, lambda c: c.terminate_session(session_id, reason))
    _cli().err.print(f"session {s['session_id']} is {s['state']}", markup=False)


# -- status without a message id: where this terminal goes --------------------------------


def where(target: Target, token: str | None, as_json: bool) -> None:
    """Print the hub or store, whether it answers, and who the token is. Exit 1 if the hub
    does not answer or the token is refused."""
    import asyncio

    cli = _cli()
    info: dict[str, Any] = target.to_json()
    problem = None
    if target.is_http:
        try:
            health = hub_request("GET", f"{target.url}/healthz", timeout=5)
        except httpx.HTTPError as exc:
            info["reachable"] = False
            what, way_out = unanswered(target.url, exc)
            problem = f"{what}; {way_out}"
        else:
            info["reachable"] = health.status_code == 200
            if not info["reachable"]:  # the hub answers 200 whatever its health
                problem = f"at {target.url}: {not_the_hub(health.status_code, health.content)}"
    elif (missing := _no_sqlite_file(target.url)) is not None:
        info["reachable"] = False  # asking must not make one
        problem = (
            f"there is no store at {missing} yet; `backchannel init --store {target.url}` "
            "makes one (any command that uses it does too)"
        )
    else:
        try:  # a store answers when it opens
            asyncio.run(_whoami(target.url, None))
            info["reachable"] = True
        except BackchannelError as exc:
            info["reachable"] = False
            problem = f"the store does not open: {exc.message}"
    identity = None
    if info["reachable"]:
        who_token = token
        if who_token is None and target.is_http:
            who_token = cli.file_admin_token(target.data_dir)
        if who_token is not None:
            try:
                identity = asyncio.run(_whoami(target.url, who_token))
            except BackchannelError as exc:
                problem = f"the token is refused: {cli.refused(exc.message)}"
    info["identity"] = identity
    if as_json:
        cli._print_json(info)
    else:
        print(f"{info['kind']}: {info['url']}")
        print(f"found by: {info['found_by']}")
        print(f"data directory: {info['data_dir']}")
        print(f"answers: {'yes' if info['reachable'] else 'no'}")
        if identity is None and not target.is_http:
            print("you are: the administrator (no token, on the store itself)")
        elif not info["reachable"]:
            print("you are: not known (the hub did not answer)")
        elif identity is None:
            print("you are: nobody yet (set BACKCHANNEL_TOKEN to a member token)")
        elif identity.get("admin"):
            print("you are: the administrator")
        else:
            print(f"you are: {identity.get('name')} of team {identity.get('team')}")
    if problem:
        cli._fail(problem)


def _no_sqlite_file(url: str) -> Path | None:
    """The file a SQLite store URL names, when it is not there (opening would make it)."""
    if not url.startswith("sqlite:"):
        return None
    from backchannel.stores.sqlite.store import sqlite_path

    path = sqlite_path(url)
    return None if path.exists() else path


async def _whoami(url: str, token: str | None) -> dict[str, Any]:
    async with Client(url, token) as client:
        return (await client.me()).model_dump()


def init(
    store: Annotated[
        str | None,
        typer.Option(help="sqlite:///path, postgresql://... [the data directory's SQLite file]"),
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Create the data directory, its admin token and its store, without a server."""
    from backchannel.interfaces.cli_hub import init_store

    cli = _cli()
    try:
        data_dir, url, new = init_store(store, home)
    except BackchannelError as exc:
        cli._fail(exc.message)
        raise
    state = "created" if new else "already there"
    cli.err.print(
        f"store {config.redact_url(url)} {state}; admin token in "
        f"{data_dir / config.ADMIN_TOKEN_FILE}",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add ``init`` and ``session`` to the ``backchannel`` CLI."""
    app.command()(init)
    app.add_typer(session_app, name="session")
