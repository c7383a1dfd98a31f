"""The ``backchannel`` command. Data goes to stdout, talk to stderr; exit 1 on failure.

Which hub: ``--url``/``BACKCHANNEL_URL``; else the server recorded in the data directory
(``$BACKCHANNEL_HOME/server.json``, written by ``serve``); else the data directory's
SQLite file, opened in this process. Which identity: ``--token``/``BACKCHANNEL_TOKEN``;
admin commands fall back to ``$BACKCHANNEL_HOME/admin.token``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from backchannel import config
from backchannel.client import Client, HttpClient, connect
from backchannel.errors import BackchannelError

T = TypeVar("T")

app = typer.Typer(
    name="backchannel",
    help="A durable message hub for teams of AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
team_app = typer.Typer(help="Create and list teams (admin).", no_args_is_help=True)
member_app = typer.Typer(help="Add and list members (admin).", no_args_is_help=True)
app.add_typer(team_app, name="team")
app.add_typer(member_app, name="member")

err = Console(stderr=True, highlight=False)
out = Console(highlight=False, soft_wrap=True)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="BACKCHANNEL_URL", help="Hub URL (http://...) or store URL."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="BACKCHANNEL_TOKEN", help="Member or admin token."),
]
HomeOpt = Annotated[
    Path | None,
    typer.Option("--home", envvar="BACKCHANNEL_HOME", help="Data directory [./.backchannel]."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except BackchannelError as exc:
        _fail(exc.message)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise AssertionError("unreachable")


def _client(url: str | None, token: str | None, home: Path | None, *, admin: bool) -> Client:
    data_dir = config.home(home)
    if url is None:
        info = config.read_server_info(data_dir)
        url = info["url"] if info else config.default_store_url(data_dir)
    if admin and token is None:
        if url.startswith(("http://", "https://")):
            token = config.admin_token(data_dir, create=False)
            if token is None:
                _fail(
                    f"no admin token: set BACKCHANNEL_TOKEN or run on the hub's host "
                    f"(looked for {data_dir / config.ADMIN_TOKEN_FILE})"
                )
            return HttpClient(url, token)
        return connect(url, None)
    if token is None:
        _fail("no token: set BACKCHANNEL_TOKEN (or --token) to a member token")
    if not url.startswith(("http://", "https://")):
        return connect(url, token)
    return HttpClient(url, token)


async def _with(client: Client, fn: Callable[[Client], Awaitable[T]]) -> T:
    async with client:
        return await fn(client)


def _print_json(data: Any) -> None:
    out.print_json(json.dumps(data)) if sys.stdout.isatty() else print(json.dumps(data))


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


# -- serve ----------------------------------------------------------------------------


@app.command()
def serve(
    store: Annotated[
        str | None,
        typer.Option(help="sqlite:///path, postgresql://... or memory:// [data dir's SQLite]"),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0 picks a free one).")] = 8765,
    lease: Annotated[float, typer.Option(help="Seconds a received message stays leased.")] = 60.0,
    max_attempts: Annotated[int, typer.Option(help="Deliveries before a message is dead.")] = 5,
    max_text: Annotated[int, typer.Option(help="Largest message text in bytes.")] = 256 * 1024,
    dispatch: Annotated[
        bool,
        typer.Option(help="Push to members with a delivery adapter (one hub per store should)."),
    ] = True,
    home: HomeOpt = None,
) -> None:
    """Run the hub: HTTP API, live streams and the data directory's admin token."""
    from backchannel.interfaces.server import run_server

    data_dir = config.home(home)
    store_url = store or config.default_store_url(data_dir)
    try:
        run_server(
            data_dir=data_dir,
            store_url=store_url,
            host=host,
            port=port,
            lease_seconds=lease,
            max_attempts=max_attempts,
            max_text=max_text,
            console=err,
            dispatch=dispatch,
        )
    except BackchannelError as exc:
        _fail(exc.message)


# -- teams and members ------------------------------------------------------------------


@team_app.command("create")
def team_create(
    name: str, url: UrlOpt = None, token: TokenOpt = None, home: HomeOpt = None
) -> None:
    """Create a team (with its `user` member). Prints the team and user's token."""
    result = _run(_with(_client(url, token, home, admin=True), lambda c: c.create_team(name)))
    err.print(f"team [bold]{name}[/bold] created; the user token is shown once:")
    _print_json(result)


@team_app.command("list")
def team_list(url: UrlOpt = None, token: TokenOpt = None, home: HomeOpt = None) -> None:
    """List teams."""
    client = _client(url, token, home, admin=True)

    async def run(c: Client) -> list[str]:
        if isinstance(c, HttpClient):
            data = await c._call("GET", "/v1/teams")
            return [t["name"] for t in data["teams"]]
        from backchannel.client import LocalClient

        assert isinstance(c, LocalClient)
        return [t.name for t in await c.hub.list_teams()]

    for name in _run(_with(client, run)):
        print(name)


@member_app.command("add")
def member_add(
    team: str,
    name: str,
    kind: Annotated[
        str, typer.Option(help="claude-code, codex, gemini, llm, http or human")
    ] = "llm",
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Add a member. Prints its token once (on stdout); keep it secret."""
    result = _run(
        _with(_client(url, token, home, admin=True), lambda c: c.add_member(team, name, kind))
    )
    err.print(f"member [bold]{name}[/bold] added to {team}; its token (shown once):")
    print(result["token"])


@member_app.command("list")
def member_list(
    team: str,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List a team's members."""
    members = _run(_with(_client(url, token, home, admin=token is None), lambda c: c.members(team)))
    if as_json:
        _print_json(members)
        return
    for m in members:
        print(f"{m['name']}\t{m['kind']}")


# -- messages ----------------------------------------------------------------------------


@app.command()
def send(
    to: Annotated[str, typer.Argument(help="Member name, or '*' for everyone else.")],
    text: Annotated[str, typer.Argument(help="The message; '-' reads it from stdin.")],
    summary: Annotated[str | None, typer.Option(help="A one-line summary.")] = None,
    message_id: Annotated[
        str | None, typer.Option("--id", help="Your id, for safe retries (idempotent).")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Send a message as the member whose token you hold. Prints the message id."""
    if text == "-":
        text = sys.stdin.read()
    result = _run(
        _with(
            _client(url, token, home, admin=False),
            lambda c: c.send(to, text, summary=summary, message_id=message_id),
        )
    )
    err.print(f"{result['status']} for {', '.join(result['recipients'])}")
    print(result["message_id"])


@app.command()
def inbox(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for more.")] = False,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the first message.")] = 0.0,
    limit: Annotated[int, typer.Option(help="At most this many per fetch.")] = 50,
    no_ack: Annotated[
        bool, typer.Option("--no-ack", help="Leave messages unacknowledged (they come back).")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Read your messages (and acknowledge them, unless --no-ack)."""

    async def run(c: Client) -> int:
        count = 0
        while True:
            got = await c.receive(limit=limit, wait=30.0 if follow else wait)
            for m in got:
                count += 1
                if as_json:
                    print(
                        json.dumps({k: v for k, v in m.__dict__.items() if k != "_client"}),
                        flush=True,
                    )
                else:
                    print(f"[{_when(m.created_at)}] {m.sender} ({m.kind}): {m.text}", flush=True)
            if got and not no_ack:
                await c.ack([m.message_id for m in got])
            if not follow and (not got or len(got) < limit):
                return count

    count = _run(_with(_client(url, token, home, admin=False), run))
    if not follow and count == 0:
        err.print("no messages")


@app.command()
def status(
    message_id: str,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a message's delivery state and history."""
    data = _run(_with(_client(url, token, home, admin=False), lambda c: c.status(message_id)))
    if as_json:
        _print_json(data)
        return
    print(f"{data['message_id']}  {data['from']} -> {data['to']}  {data['status']}")
    for d in data["deliveries"]:
        extra = f"  ({d['dead_reason']})" if d.get("dead_reason") else ""
        print(f"  {d['to']}: {d['state']}, {d['attempts']} attempt(s){extra}")
    for h in data["history"]:
        detail = f" {h['detail']}" if h["detail"] else ""
        print(f"  {_when(h['at'])}  {h['to']}  {h['event']}{detail}")


@app.command()
def run(
    team_file: Annotated[Path, typer.Argument(help="The team file (YAML).")],
    task: Annotated[str, typer.Argument(help="The task for the team's lead.")],
    team: Annotated[
        str | None, typer.Option("--team", help="Team name on the hub [the file's].")
    ] = None,
    workspace: Annotated[Path, typer.Option(help="Directory the workspace tools may read.")] = Path(
        "."
    ),
    timeout: Annotated[float, typer.Option(help="Stop after this many seconds.")] = 600.0,
    quiet: Annotated[float, typer.Option(help="Seconds of quiet that end the run.")] = 2.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Host a team file's llm members on a hub and give the lead a task."""
    from backchannel.runtimes.session import print_report, run_team
    from backchannel.runtimes.teamfile import load_team

    data_dir = config.home(home)
    if url is None:
        info = config.read_server_info(data_dir)
        url = info["url"] if info else config.default_store_url(data_dir)
    admin_token = token or (
        config.admin_token(data_dir, create=False) if url.startswith("http") else None
    )
    if url.startswith("http") and admin_token is None:
        _fail(
            f"no admin token: set BACKCHANNEL_TOKEN, or run where {data_dir / config.ADMIN_TOKEN_FILE} is"
        )
    try:
        spec = load_team(team_file)
    except BackchannelError as exc:
        _fail(exc.message)
    result = _run(
        run_team(
            spec,
            task,
            url=url,
            admin_token=admin_token,
            workspace=workspace,
            team_name=team,
            time_limit=timeout,
            quiet_seconds=quiet,
            console=err,
        )
    )
    if as_json:
        import dataclasses

        print(json.dumps(dataclasses.asdict(result)))
    else:
        print_report(result, out)


timer_app = typer.Typer(help="Heartbeats: set, list and cancel timers.", no_args_is_help=True)
app.add_typer(timer_app, name="timer")


@timer_app.command("set")
def timer_set(
    intent: Annotated[str, typer.Argument(help="anchor, check or wait")],
    minutes: Annotated[float, typer.Argument(help="Due in this many minutes.")],
    note: Annotated[str, typer.Argument(help="The breadcrumb you will read when it fires.")],
    target: Annotated[str | None, typer.Option(help="The peer, for check and wait.")] = None,
    session: Annotated[str | None, typer.Option(help="Your session [your only open one].")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Set a timer on one of your sessions. Prints its id."""
    timer = _run(
        _with(
            _client(url, token, home, admin=False),
            lambda c: c.set_timer(intent, minutes, note, target, session=session),
        )
    )
    err.print(f"{timer['intent']} timer due in {timer['due_in']:.0f} s")
    print(timer["timer_id"])


@timer_app.command("list")
def timer_list(
    session: Annotated[str | None, typer.Option(help="Only this session's timers.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pending timers of your team."""
    found = _run(_with(_client(url, token, home, admin=False), lambda c: c.timers(session=session)))
    if as_json:
        _print_json(found)
        return
    for t in found:
        target = f" -> {t['target']}" if t["target"] else ""
        print(
            f"{t['timer_id']}\t{t['session']}\t{t['intent']}{target}\tdue in {t['due_in']:.0f} s\t{t['note']}"
        )
    if not found:
        err.print("no pending timers")


@timer_app.command("cancel")
def timer_cancel(
    timer_id: int, url: UrlOpt = None, token: TokenOpt = None, home: HomeOpt = None
) -> None:
    """Cancel one of your pending timers."""
    _run(_with(_client(url, token, home, admin=False), lambda c: c.cancel_timer(timer_id)))
    err.print(f"timer {timer_id} cancelled")


@app.command()
def links(
    open_only: Annotated[bool, typer.Option("--open", help="Only links still open.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your team's links: peers, turns used of the budget, state, why closed."""
    found = _run(
        _with(_client(url, token, home, admin=False), lambda c: c.links(open_only=open_only))
    )
    if as_json:
        _print_json(found)
        return
    for link in found:
        why = f" ({link['close_reason']})" if link["close_reason"] else ""
        print(
            f"{link['link_id']}  {link['initiator']} <-> {link['responder']}  "
            f"{link['turns_used']}/{link['budget']} turns  {link['state']}{why}"
        )
    if not found:
        err.print("no links")


@app.command()
def tail(
    team: Annotated[str | None, typer.Argument(help="Team to watch [your own].")] = None,
    after: Annotated[int, typer.Option(help="Start after this cursor (0: from the start).")] = 0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Live view of a team's traffic: sends, leases, acks and dead letters."""
    client = _client(url, token, home, admin=token is None)

    def show(item: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(item), flush=True)
            return
        detail = f" ({item['detail']})" if item.get("detail") else ""
        print(
            f"[{_when(item['at'])}] {item['event']:<13} {item['from']} -> {item['to']} "
            f"{item['kind']}: {item['summary']}{detail}",
            flush=True,
        )

    async def run(c: Client) -> None:
        nonlocal team
        if isinstance(c, HttpClient):
            if team is None:
                team = (await c._call("GET", "/v1/me"))["team"]
            async with c._http.stream(
                "GET", f"/v1/teams/{team}/events", params={"after": after}, timeout=None
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    from backchannel.client import _raise_for

                    _raise_for(resp)
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        show(json.loads(line[6:]))
            return
        from backchannel.client import LocalClient

        assert isinstance(c, LocalClient)
        if team is None:
            if c._me is None:
                _fail("name the team to watch")
            assert c._me is not None
            team = c._me.team
        await c.hub.get_team(team)
        async for item in c.hub.watch(team, after):
            show(item.to_json())

    with suppress(KeyboardInterrupt):
        _run(_with(client, run))


from backchannel.interfaces import cli_agents  # noqa: E402  (registers hook, mcp, attach)

cli_agents.register(app)


def main() -> None:
    # a closed stdout (``| head``) is not an error worth a traceback
    with suppress(AttributeError):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":
    main()
