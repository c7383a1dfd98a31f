"""The ``backchannel`` command. Data goes to stdout, talk to stderr. Exit codes: 0 done,
1 the command failed (the hub refused, nothing found, no hub), 2 the command line is wrong.

Which hub: see :mod:`backchannel.interfaces.cli_hub` (``backchannel status`` says which);
no command but ``serve``, ``init`` or an explicit ``--store`` creates a store. Which
identity: ``--token``/``BACKCHANNEL_TOKEN``; admin commands fall back to
``$BACKCHANNEL_HOME/admin.token``. Listings take ``--json``: a JSON array (``[]`` when
empty) with the HTTP API's field names.
"""

from __future__ import annotations

import asyncio
import errno
import io
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
from backchannel.client import Client
from backchannel.core.ids import new_message_id
from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.core.timers import MAX_TIMER_PAGE, TIMER_PAGE, Intent
from backchannel.delivery.ownership import MIN_OWNERSHIP_S, OWNERSHIP_S
from backchannel.errors import (
    AnchorRequired,
    BackchannelError,
    Forbidden,
    PeerError,
    Unauthorized,
)
from backchannel.interfaces import cli_hub
from backchannel.interfaces.cli_options import (
    HomeOpt,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    WholeHelpGroup,
    choice,
    finite,
)
from backchannel.interfaces.terminal import markup_safe, printable
from backchannel.interfaces.terminal import printable as _p
from backchannel.models import MemberInfo, Received
from backchannel.types import MemberKind

T = TypeVar("T")

# plain help (no rich markup: hints such as "[your own]" stay as written); -h or --help
PLAIN: dict[str, Any] = {"rich_markup_mode": None, "no_args_is_help": True, "cls": WholeHelpGroup}
app = typer.Typer(
    name="backchannel",
    help="A durable message hub for teams of AI agents.",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    **PLAIN,
)
team_app = typer.Typer(help="Create, list and remove teams (admin).", **PLAIN)
member_app = typer.Typer(
    help="Add, list, show and remove members, set their push delivery, rotate their tokens "
    "(admin).",
    **PLAIN,
)
app.add_typer(team_app, name="team")
app.add_typer(member_app, name="member")

# soft_wrap: a long line is never cut into 80 columns (pipes, logs, narrow terminals)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> None:
    err.print("[red]error:[/red] ", end="")
    err.print(printable(message, multiline=True), markup=False)
    raise typer.Exit(code)


# -- global options: --version, --verbose ----------------------------------------------
_verbose = False


def read_stdin(param_hint: str) -> str:
    """All of stdin as text (for an argument given as ``-``), refused with the way out
    when there is none or it is not UTF-8."""
    if sys.stdin is None:
        raise typer.BadParameter("'-' reads stdin, and stdin is closed", param_hint=param_hint)
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise typer.BadParameter(
            f"stdin is not UTF-8 (byte {exc.start} is {data[exc.start]:#04x}); "
            "convert it first, e.g. with iconv -t UTF-8",
            param_hint=param_hint,
        ) from None


def _argv_not_utf8(argv: list[str]) -> str | None:
    """Why an argument cannot be sent to the hub (it is not UTF-8), or None."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            return f"argument '{printable(shown)}' is not UTF-8; the hub takes UTF-8 text only"
    return None


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"backchannel {version('backchannel')}")
        raise typer.Exit()


@app.callback()
def _main_options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Say which hub or store each command uses.")
    ] = False,
) -> None:
    global _verbose
    _verbose = verbose


def _locate(url: str | None, home: Path | None) -> cli_hub.Target:
    try:
        target = cli_hub.locate(url, home)
    except BackchannelError as exc:
        _fail(exc.message)
        raise
    if _verbose:
        err.print(f"using {target.describe()}", markup=False)
    return target


# where this command's admin token came from, when it was read from a data directory
_admin_token_file: Path | None = None


def file_admin_token(data_dir: Path) -> str | None:
    """The admin token in ``data_dir``, remembered as this command's (see :func:`_run`)."""
    global _admin_token_file
    try:
        token = config.admin_token(data_dir, create=False)
    except BackchannelError as exc:
        _fail(exc.message)
        raise
    _admin_token_file = data_dir / config.ADMIN_TOKEN_FILE if token is not None else None
    return token


# the data directory whose admin token an admin command passed over for a token it was
# given (--token or BACKCHANNEL_TOKEN), named when the hub says that one is a member's
_given_over: Path | None = None


def forbidden(message: str) -> str:
    """A hub's 403 ``message``, and, when an admin command was given a token rather than
    reading the data directory's, the way to the admin token."""
    if _given_over is None:
        return message
    return (
        f"{message}. This command used the token of --token or BACKCHANNEL_TOKEN; unset "
        f"BACKCHANNEL_TOKEN (and leave out --token) to use {_given_over / config.ADMIN_TOKEN_FILE}"
        " on the hub's host, or pass the admin token with --token"
    )


def refused(message: str) -> str:
    """A hub's 401 ``message``, and, when the token was read from a data directory, that
    this is another hub's and the way to this one's."""
    if _admin_token_file is None:
        return message
    return (
        f"{message} (the admin token in {_admin_token_file} is not this hub's: set "
        "BACKCHANNEL_HOME to the data directory of the hub's `serve`, or BACKCHANNEL_TOKEN)"
    )


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except Unauthorized as exc:
        _fail(refused(exc.message))
    except Forbidden as exc:
        _fail(forbidden(exc.message))
    except BackchannelError as exc:
        _fail(exc.message)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise AssertionError("unreachable")


#: How long a command rides out a hub it cannot reach (a person waits on it): a refused
#: connection is tried a few times within it, a send whose answer was lost made again.
CLI_RETRY_WITHIN = 1.0


def _client(url: str | None, token: str | None, home: Path | None, *, admin: bool) -> Client:
    target = _locate(url, home)
    data_dir, url = target.data_dir, target.url
    if admin and token is not None:
        global _given_over
        _given_over = data_dir
    if admin and token is None:
        if url.startswith(("http://", "https://")):
            token = file_admin_token(data_dir)
            if token is None:
                _fail(
                    f"no admin token in {data_dir / config.ADMIN_TOKEN_FILE}: run this from "
                    "the directory `backchannel serve` was started in, set BACKCHANNEL_HOME "
                    "to the hub's data directory, or set BACKCHANNEL_TOKEN (or --token) to "
                    "the admin token (the hub's admin.token)"
                )
            return Client(url, token, retry_within=CLI_RETRY_WITHIN)
        return Client(url, None)
    if token is None:
        _fail("no token: set BACKCHANNEL_TOKEN (or --token) to a member token")
    return Client(url, token, retry_within=CLI_RETRY_WITHIN)


async def _with(client: Client, fn: Callable[[Client], Awaitable[T]]) -> T:
    async with client:
        return await fn(client)


def _print_json(data: Any) -> None:
    text = json.dumps(plain(data))
    out.print_json(text) if sys.stdout.isatty() else print(text)


def _page(
    found: list[Any],
    *,
    limit: int,
    every: bool,
    what: str,
    again: Callable[[Any], str],
    as_json: bool,
) -> list[Any]:
    """One page of a list read with one more than ``limit`` (so whether more follow is
    said, never left for the reader to guess): the rows shown, printed as JSON on stdout
    when ``as_json``; when more follow, the command for the next page (``again(last
    shown)``) goes to stderr."""
    more = not every and len(found) > limit
    if more:
        found = found[:limit]
    if as_json:
        _print_json(found)
    if more:
        err.print(
            markup_safe(
                f"showing the first {limit} {what}; more follow: {again(found[-1])} "
                "(or --all for every one)"
            )
        )
    return found


def plain(data: Any) -> Any:
    """``data`` as JSON values: the client's models as they are on the wire."""
    if hasattr(data, "model_dump"):
        return data.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(data, list | tuple):
        return [plain(x) for x in data]
    if isinstance(data, dict):
        return {k: plain(v) for k, v in data.items()}
    return data


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
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="TCP port (0 picks a free one).")
    ] = config.DEFAULT_PORT,
    lease: Annotated[
        float, typer.Option(callback=finite, help="Seconds a received message stays leased.")
    ] = 60.0,
    max_attempts: Annotated[int, typer.Option(help="Deliveries before a message is dead.")] = 5,
    max_text: Annotated[
        int, typer.Option(min=1, help="Largest message text, in UTF-8 bytes.")
    ] = 256 * 1024,
    dispatch: Annotated[
        bool,
        typer.Option(
            help="Push to members with a delivery adapter (safe in every hub of a store: "
            "each member is pushed by one hub at a time)."
        ),
    ] = True,
    dispatch_lease: Annotated[
        float,
        typer.Option(
            callback=finite,
            help="Seconds a hub's hold on a member's push delivery lasts unrenewed: how soon "
            f"another hub takes over after a crash (at least {MIN_OWNERSHIP_S:g}).",
        ),
    ] = OWNERSHIP_S,
    retention_days: Annotated[
        float,
        typer.Option(
            callback=finite, help="Days acked and dead messages are kept (0 keeps them forever)."
        ),
    ] = 30.0,
    log_format: Annotated[
        str, typer.Option(help="text, or json (one object per line) for log collectors.")
    ] = "text",
    header_timeout: Annotated[
        float,
        typer.Option(
            min=0.1, callback=finite, help="Seconds a client may take to send a request's head."
        ),
    ] = 10.0,
    body_timeout: Annotated[
        float,
        typer.Option(
            min=0.1, callback=finite, help="Seconds a client may take to send a request's body."
        ),
    ] = 30.0,
    max_connections: Annotated[
        int,
        typer.Option(
            min=1,
            help="Open connections before new ones get 503 (at most half the open-file limit).",
        ),
    ] = 1000,
    cpu: Annotated[
        int | None,
        typer.Option(
            help="Run the hub's process on this one CPU (Linux): its Python uses one core "
            "at most, and on a virtual machine its threads hand work over faster on one.",
        ),
    ] = None,
    pg_heartbeat: Annotated[
        float | None,
        typer.Option(
            callback=finite,
            help="PostgreSQL store: seconds between the listener's SELECT 1 heartbeats "
            "(at least 0.2) [2].",
        ),
    ] = None,
    pg_frozen_after: Annotated[
        float | None,
        typer.Option(
            callback=finite,
            help="PostgreSQL store: seconds a heartbeat may go unanswered before the hub "
            "checks with a new connection whether the server is frozen, and if so cuts the "
            "requests in flight (503) (at least 1) [10].",
        ),
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Run the hub: HTTP API, live streams and the data directory's admin token."""
    from backchannel.interfaces.guard import ConnectionLimits

    if dispatch_lease < MIN_OWNERSHIP_S:
        raise typer.BadParameter(
            f"{dispatch_lease:g} s is too short: it must be at least {MIN_OWNERSHIP_S:g} "
            "seconds. A hub renews its hold every quarter of it and a renewal on a busy store "
            "can take over a second, so a shorter hold runs out while the hub is alive and "
            f"pushing stops and starts again; use --dispatch-lease {MIN_OWNERSHIP_S:g} for the "
            "fastest takeover after a crash",
            param_hint="--dispatch-lease",
        )
    if log_format not in ("text", "json"):
        raise typer.BadParameter("use text or json", param_hint="--log-format")
    if cpu is not None:  # before any thread starts: each new one runs where its creator does
        from backchannel.tuning import pin_to_cpu

        try:
            pin_to_cpu(cpu)
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--cpu") from None
    from backchannel.interfaces.server import run_server

    try:
        data_dir = config.home(home)
        store_url = store or config.default_store_url(data_dir)
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
            dispatch_lease=dispatch_lease,
            retention_seconds=retention_days * 86400 if retention_days != 0 else None,
            log_format="json" if log_format == "json" else "text",
            limits=ConnectionLimits(header_timeout, body_timeout, max_connections),
            pg_heartbeat=pg_heartbeat,
            pg_frozen_after=pg_frozen_after,
        )
    except BackchannelError as exc:
        _fail(exc.message)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(f"{where}{exc.strerror or exc}")  # a full disk: said with the way out


# -- teams and members ------------------------------------------------------------------


@team_app.command("create")
def team_create(
    name: str,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole team as JSON, not just the token.")
    ] = False,
) -> None:
    """Create a team with its `user` member (you). Prints user's token, once."""
    result = _run(_with(_client(url, token, home, admin=True), lambda c: c.create_team(name)))
    err.print(f"team [bold]{name}[/bold] created; the token of its user (shown once):")
    if as_json:
        _print_json(result)
    else:
        print(result["user_token"])


@team_app.command("list")
def team_list(
    after: Annotated[
        str | None, typer.Option(help="Only teams named after this one (the last shown).")
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
    """List teams by name, a page at a time (the next page's command is printed on
    stderr when there are more; --all shows them all)."""
    client = _client(url, token, home, admin=True)
    # one more than shown: whether more follow is said, never left for the reader to guess
    found = _run(_with(client, lambda c: c.teams(after=after, limit=None if every else limit + 1)))
    found = _page(
        found,
        limit=limit,
        every=every,
        what="teams",
        again=lambda last: f"backchannel team list --after {last['name']}",
        as_json=as_json,
    )
    if as_json:
        return
    for t in found:
        print(_p(t["name"]))
    if not found:
        err.print("no teams")


DELIVERY_HELP = (
    "Push delivery setting: a JSON object such as "
    '\'{"type": "tmux", "target": "work:0.1"}\', @FILE to read it from a file on this '
    "machine, or - for stdin (docs/adapters/README.md)."
)


def delivery_arg(value: str) -> dict[str, Any]:
    """The ``--delivery`` value as the JSON object to send: given inline, ``@FILE`` (read
    here, by the CLI, on the user's machine: the hub never opens a path a request names)
    or ``-`` (stdin); ``none`` is ``{}`` (no push: the member pulls). Refused, saying
    where, when it is not a JSON object; the hub checks what the object says."""
    hint = "'--delivery'"
    if value.strip().lower() == "none":
        return {}
    if value == "-":
        text, source = read_stdin(hint), "stdin"
    elif value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise typer.BadParameter(
                f"cannot read {str(path)!r}: {why}; give @FILE of a JSON file you can read",
                param_hint=hint,
            ) from None
        source = str(path)
    else:
        text, source = value, "the value"
    try:
        setting = json.loads(text)
    except (RecursionError, ValueError) as exc:
        if not isinstance(exc, json.JSONDecodeError):  # nested too deep, a huge number
            raise typer.BadParameter(
                f"{source} is not a JSON object the hub takes: "
                f"{'nested too deep' if isinstance(exc, RecursionError) else 'a number with too many digits'}; give a "
                'flat JSON object such as \'{"type": "tmux", "target": "work:0.1"}\'',
                param_hint=hint,
            ) from None
        lines = text.splitlines()
        line = lines[exc.lineno - 1] if 0 < exc.lineno <= len(lines) else ""
        raise typer.BadParameter(
            f"{source} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}:\n"
            f"  {line}\n  {' ' * (exc.colno - 1)}^\n"
            'give a JSON object such as \'{"type": "tmux", "target": "work:0.1"}\' '
            "(quote it for the shell with single quotes)",
            param_hint=hint,
        ) from None
    if not isinstance(setting, dict):
        raise typer.BadParameter(
            f"{source} is JSON {type(setting).__name__ if setting is not None else 'null'}, "
            'not an object: give an object such as \'{"type": "webhook", "service": "NAME"}\''
            ", or none for no push delivery",
            param_hint=hint,
        )
    return setting


def _shown_delivery(setting: dict[str, Any] | None) -> str:
    """A delivery setting on one line: ``pull`` when there is none."""
    if not setting:
        return "pull"
    return json.dumps(setting, ensure_ascii=False, separators=(", ", ": "))


@member_app.command("add")
def member_add(
    team: str,
    name: str,
    kind: Annotated[
        str,
        typer.Option(
            callback=choice(MemberKind), help="claude-code, codex, gemini, llm, http or human"
        ),
    ] = "llm",
    delivery: Annotated[
        str | None,
        typer.Option(help=DELIVERY_HELP + " none or left out: the member pulls its messages."),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Add a member. Prints its token once (on stdout); keep it secret."""
    setting = delivery_arg(delivery) if delivery is not None else None
    result = _run(
        _with(
            _client(url, token, home, admin=True),
            lambda c: c.add_member(team, name, kind, delivery=setting),
        )
    )
    err.print(f"member [bold]{name}[/bold] added to {team}; its token (shown once):")
    print(result["token"])


@member_app.command("set")
def member_set(
    team: str,
    name: str,
    delivery: Annotated[
        str,
        typer.Option(help=DELIVERY_HELP + " none clears it: the member pulls its messages."),
    ],
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the member as JSON (secrets redacted).")
    ] = False,
) -> None:
    """Change (or with --delivery none clear) a member's push delivery setting. Its
    messages not yet delivered go the new way; a push circuit about the old target ends."""
    setting = delivery_arg(delivery)
    client = _client(url, token, home, admin=True)

    async def change(c: Client) -> MemberInfo:
        await c.update_member(team, name, delivery=setting)
        return next(m for m in await c.members(team) if m.name == name)

    member = _run(_with(client, change))
    shown = member.delivery if member.delivery is not None else {}
    err.print(
        markup_safe(f"member {name} in {team} now: {_shown_delivery(shown)}"),
        highlight=False,
    )
    if setting.get("type", "pull") not in ("pull", "hook"):
        err.print(
            "the hub reaches the target when a message comes: `backchannel member show "
            f"{team} {name}` says if the push is down, and why"
        )
    if as_json:
        _print_json(member)


@member_app.command("show")
def member_show(
    team: str,
    name: str,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a member: kind, delivery setting (admin; secrets redacted), presence and
    whether its push is down."""
    members = _run(_with(_client(url, token, home, admin=token is None), lambda c: c.members(team)))
    found = next((m for m in members if m.name == name), None)
    if found is None:
        names = ", ".join(m.name for m in members)
        _fail(f"no member {name!r} in team {team!r}; its members: {names}")
        raise AssertionError("unreachable")
    if as_json:
        _print_json(found)
        return
    print(f"name\t{_p(found.name)}\nkind\t{_p(found.kind)}")
    if found.delivery is not None:
        print(f"delivery\t{_p(_shown_delivery(found.delivery))}")
    if seen := found.presence:
        print(f"presence\t{_p(seen.state)}\t{_p(seen.last_event or '')}")
    if down := found.push_circuit:
        print(
            f"push\tdown since {_when(down.down_since)} ({_p(down.target)}): "
            f"{_p(down.reason)}; next try at {_when(down.next_probe_at)}"
        )
    elif found.delivery:
        print("push\tup")


@member_app.command("list")
def member_list(
    team: str,
    after: Annotated[
        str | None, typer.Option(help="Only members named after this one (the last shown).")
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
    """List a team's members by name, a page at a time (the next page's command is
    printed on stderr when there are more; --all shows them all)."""
    # one more than shown: whether more follow is said, never left for the reader to guess
    members = _run(
        _with(
            _client(url, token, home, admin=token is None),
            lambda c: c.members(team, after=after, limit=None if every else limit + 1),
        )
    )
    members = _page(
        members,
        limit=limit,
        every=every,
        what="members",
        again=lambda last: f"backchannel member list {team} --after {last['name']}",
        as_json=as_json,
    )
    if as_json:
        return
    for m in members:
        # columns, each made printable on its own (a tab of ours stays a tab)
        cols = [m["name"], m["kind"]]
        if m.get("delivery") is not None:  # the admin sees where each member's messages go
            cols.append(_shown_delivery(m["delivery"]))  # (redacted by the hub)
        if seen := m.get("presence"):  # Claude Code teammates: state from inbox traffic
            cols += [seen["state"], seen["last_event"] or ""]
        if down := m.get("push_circuit"):  # its push target is down (delivery/circuit.py)
            cols.append(f"push down since {_when(down['down_since'])}: {down['reason']}")
        print("\t".join(_p(c) for c in cols))


# -- credentials and removal (admin) -----------------------------------------------------


@member_app.command("rotate-token")
def member_rotate_token(
    team: str, name: str, url: UrlOpt = None, token: TokenOpt = None, home: HomeOpt = None
) -> None:
    """Give a member a new token (printed once); the old one stops working at once."""
    result = _run(
        _with(_client(url, token, home, admin=True), lambda c: c.rotate_token(team, name))
    )
    err.print(f"new token for [bold]{name}[/bold] in {team} (shown once; the old one is void):")
    print(result["token"])


@member_app.command("remove")
def member_remove(
    team: str,
    name: str,
    reason: Annotated[str, typer.Option(help="Why; told to senders of undelivered mail.")] = "",
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Remove a member: mail still waiting for it becomes dead letters (senders are told),
    its links close, its timers are cancelled, its token stops working."""
    result = _run(
        _with(
            _client(url, token, home, admin=True),
            lambda c: c.remove_member(team, name, reason=reason),
        )
    )
    err.print(
        f"member [bold]{name}[/bold] removed from {team}: {result['dead_letters']} dead "
        f"letter(s), {result['links_closed']} link(s) closed, {result['jobs_cancelled']} "
        "timer(s) cancelled"
    )
    _print_json(result)


@team_app.command("remove")
def team_remove(
    name: str,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: everything of the team goes.")] = (
        False
    ),
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Remove a team and everything stored for it (messages, transcripts, timers)."""
    if not yes:
        _fail(f"removing team {name!r} deletes all it holds; run again with --yes to confirm")
    result = _run(_with(_client(url, token, home, admin=True), lambda c: c.remove_team(name)))
    err.print(
        f"team [bold]{name}[/bold] removed; {result['dropped']} undelivered copies went with it"
    )
    _print_json(result)


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
        text = read_stdin("TEXT")
    if not text.strip():
        raise typer.BadParameter("the message is empty; say something", param_hint="TEXT")
    client = _client(url, token, home, admin=False)
    given = message_id is not None
    # picked here, not by the client, so that a send whose answer never came back can be
    # made again as the same message: the error says how
    mid = message_id or new_message_id()
    try:
        result = asyncio.run(
            _with(client, lambda c: c.send(to, text, summary=summary, message_id=mid))
        )
    except AnchorRequired as exc:
        sid = exc.details.get("session", "SESSION")
        _fail(
            f"{exc.message}\nFrom the command line: backchannel timer set anchor 10 "
            f"'return to <your task>' --session {sid}"
        )
        raise
    except PeerError as exc:
        again = "the same command" if given else f"the same command with --id {mid}"
        _fail(
            f"{exc.message}\nTo send it again safely, run {again} (the hub stores a "
            "message once under its id, however many tries reach it)"
        )
        raise
    except BackchannelError as exc:
        _fail(exc.message)
        raise
    err.print(markup_safe(f"{result['status']} for {', '.join(result['recipients'])}"))
    for warning in result["warnings"]:  # a recipient's push delivery is down
        err.print(markup_safe(f"warning: {warning}"))
    print(_p(result["message_id"]))


@app.command()
def inbox(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for more.")] = False,
    wait: Annotated[
        float, typer.Option(callback=finite, help="Seconds to wait for the first message.")
    ] = 0.0,
    limit: Annotated[int, typer.Option(help="At most this many per fetch.")] = 50,
    no_ack: Annotated[
        bool, typer.Option("--no-ack", help="Leave messages unacknowledged (they come back).")
    ] = False,
    session: Annotated[
        str | None,
        typer.Option(help="Also read what is pinned to this session of yours (fired timers)."),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="A JSON array ([] when empty); with --follow one per line."),
    ] = False,
) -> None:
    """Read your messages (and acknowledge them, unless --no-ack)."""
    no_sigpipe()

    def line(m: Received) -> str:
        if as_json:
            return json.dumps(cli_hub.message_json(m))
        return (
            f"[{_when(m.created_at)}] {_p(m.sender)} ({_p(m.kind)}): "
            f"{printable(m.text, multiline=True)}"
        )

    async def run(c: Client) -> int:
        count = 0
        held: list[Received] = []  # received and not written yet: given back if need be
        written: list[str] = []  # written and not acked yet
        try:
            while True:
                got = await c.receive(limit=limit, wait=30.0 if follow else wait, session=session)
                held.extend(got)
                count += len(got)
                if not as_json or follow:
                    while held:
                        write_line(line(held[0]))
                        written.append(held.pop(0).message_id)
                    await settled(c, written, held)
                if not follow and (not got or len(got) < limit):
                    break
            if held:  # --json without --follow: one array, acked once it was written
                write_line(json.dumps([cli_hub.message_json(m) for m in held]))
                written.extend(m.message_id for m in held)
                held.clear()
            elif as_json and not follow:
                write_line("[]")
            return count
        finally:
            await settled(c, written, held)

    async def settled(c: Client, written: list[str], held: list[Received]) -> None:
        """Ack what was written (unless --no-ack) and give back at once what was not,
        even when Ctrl-C came meanwhile: a message shown and then not acked would be
        shown again, one not shown would wait out its lease. A second Ctrl-C stops it."""
        ack, back = ([] if no_ack else list(written)), [m.message_id for m in held]
        written.clear()
        held.clear()

        async def settle() -> None:
            if ack:
                await c.ack(ack)
            if back:
                await c.release(back)

        task = asyncio.ensure_future(settle())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await task
            raise

    try:
        count = _run(_with(_client(url, token, home, admin=False), run))
    except BrokenPipeError:
        died_of_sigpipe()
    except StdoutFailed as exc:
        _fail(
            f"cannot write to stdout: {exc.strerror or exc}; "
            "the messages not written are back in the inbox"
        )
    if not follow and count == 0:
        err.print("no messages")


class StdoutFailed(OSError):
    """stdout took no more (a full disk, an I/O error): said as such, not a traceback."""


def no_sigpipe() -> None:
    """Writing to a closed pipe raises BrokenPipeError instead of ending the process, so
    a command that holds leased messages can give them back first (see
    :func:`died_of_sigpipe`)."""
    with suppress(AttributeError, ValueError):  # no SIGPIPE, or not the main thread
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def died_of_sigpipe() -> None:
    """End as a Unix tool does when its reader closed the pipe (``| head -1``): by
    SIGPIPE, quietly, so the shell sees what it sees of ``cat``."""
    with suppress(OSError):  # nothing more is written to the closed pipe at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    with suppress(AttributeError):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    raise typer.Exit(141)


def write_line(text: str) -> None:
    """Write ``text`` and a newline to stdout, all of it, before returning. ``print``
    can return having written only part of a line longer than the pipe holds when a
    signal (Ctrl-C) interrupts the write; a message acked after that was never shown
    whole. Characters stdout's encoding lacks are escaped (as its ``errors`` says)."""
    stream = sys.stdout
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        fd = None  # not a file (captured): its write is whole
    try:
        if fd is None:
            print(text, flush=True)
            return
        stream.flush()
        data = memoryview(
            f"{text}\n".encode(stream.encoding or "utf-8", stream.errors or "backslashreplace")
        )
        while data:
            data = data[os.write(fd, data) :]
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutFailed(exc.errno, exc.strerror) from exc


@app.command()
def status(
    message_id: Annotated[
        str | None, typer.Argument(help="A message id [none: the hub, the store and who you are].")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Which hub or store this terminal talks to, as whom; or a message's delivery history."""
    if message_id is None:
        from backchannel.interfaces.cli_sessions import where

        where(_locate(url, home), token, as_json)
        return
    data = _run(_with(_client(url, token, home, admin=False), lambda c: c.status(message_id)))
    if as_json:
        _print_json(data)
        return
    print(_p(f"{data['message_id']}  {data['from']} -> {data['to']}  {data['status']}"))
    for d in data["deliveries"]:
        extra = f"  ({d['dead_reason']})" if d.get("dead_reason") else ""
        print(_p(f"  {d['to']}: {d['state']}, {d['attempts']} attempt(s){extra}"))
    for h in data["history"]:
        detail = f" {h['detail']}" if h["detail"] else ""
        print(_p(f"  {_when(h['at'])}  {h['to']}  {h['event']}{detail}"))


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
    timeout: Annotated[
        float, typer.Option(callback=finite, help="Stop after this many seconds.")
    ] = 600.0,
    quiet: Annotated[
        float, typer.Option(callback=finite, help="Seconds of quiet that end the run.")
    ] = 2.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Host a team file's llm members on a hub and give the lead a task."""
    from backchannel.runner.command import print_report, run_team
    from backchannel.runner.teamfile import load_team

    target = _locate(url, home)
    data_dir, url = target.data_dir, target.url
    admin_token = token or (file_admin_token(data_dir) if url.startswith("http") else None)
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
    if result.failed:  # the report says which session stopped, and why
        raise typer.Exit(1)


timer_app = typer.Typer(help="Heartbeats: set, list and cancel timers.", **PLAIN)
app.add_typer(timer_app, name="timer")


@timer_app.command("set")
def timer_set(
    intent: Annotated[str, typer.Argument(callback=choice(Intent), help="anchor, check or wait")],
    minutes: Annotated[float, typer.Argument(callback=finite, help="Due in this many minutes.")],
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
    after: Annotated[
        int, typer.Option(min=0, help="Only timers set after this timer id (the last one shown).")
    ] = 0,
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_TIMER_PAGE, help="Show at most this many.")
    ] = TIMER_PAGE,
    every: Annotated[
        bool, typer.Option("--all", help="Every one, read from the hub a page at a time.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pending timers of your team, in the order they were set, a page at a time (the
    next page's command is printed on stderr when there are more; --all shows them all)."""
    # one more than shown: whether more follow is said, never left for the reader to guess
    found = _run(
        _with(
            _client(url, token, home, admin=False),
            lambda c: c.timers(session=session, after=after, limit=None if every else limit + 1),
        )
    )
    found = _page(
        found,
        limit=limit,
        every=every,
        what="timers",
        again=lambda last: (
            f"backchannel timer list --after {last['timer_id']}"
            + (f" --session {session}" if session is not None else "")
        ),
        as_json=as_json,
    )
    if as_json:
        return
    for t in found:
        target = f" -> {t['target']}" if t["target"] else ""
        print(
            "\t".join(
                _p(v)
                for v in (
                    t["timer_id"],
                    t["session"],
                    f"{t['intent']}{target}",
                    f"due in {t['due_in']:.0f} s",
                    t["note"],
                )
            )
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
    after: Annotated[
        str | None,
        typer.Option(help="Only links opened after this link id (the last one shown)."),
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
    """Your team's links: peers, turns used of the budget, state, why closed; in the order
    they opened, a page at a time (the next page's command is printed on stderr when
    there are more; --all shows them all)."""
    # one more than shown: whether more follow is said, never left for the reader to guess
    found = _run(
        _with(
            _client(url, token, home, admin=False),
            lambda c: c.links(open_only=open_only, after=after, limit=None if every else limit + 1),
        )
    )
    found = _page(
        found,
        limit=limit,
        every=every,
        what="links",
        again=lambda last: (
            f"backchannel links --after {last['link_id']}" + (" --open" if open_only else "")
        ),
        as_json=as_json,
    )
    if as_json:
        return
    for link in found:
        why = f" ({link['close_reason']})" if link["close_reason"] else ""
        print(
            _p(
                f"{link['link_id']}  {link['initiator']} <-> {link['responder']}  "
                f"{link['turns_used']}/{link['budget']} turns  {link['state']}{why}"
            )
        )
    if not found:
        err.print("no links")


@app.command()
def delegations(
    member: Annotated[
        str | None,
        typer.Option(help="Only those this member called or was asked (with you, or any: user)."),
    ] = None,
    pending: Annotated[
        bool, typer.Option("--pending", help="Only those still waiting for their answer.")
    ] = False,
    after: Annotated[
        str | None,
        typer.Option(help="Only delegations made after this delegation id (the last one shown)."),
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
    """The delegations you made or were asked (the team's user: every one of the team's):
    caller, callee, state, task; in the order they were made, a page at a time (the next
    page's command is printed on stderr when there are more; --all shows them all)."""
    # one more than shown: whether more follow is said, never left for the reader to guess
    found = _run(
        _with(
            _client(url, token, home, admin=False),
            lambda c: c.delegations(
                member=member,
                pending_only=pending,
                after=after,
                limit=None if every else limit + 1,
            ),
        )
    )
    found = _page(
        found,
        limit=limit,
        every=every,
        what="delegations",
        again=lambda last: (
            f"backchannel delegations --after {last['delegation_id']}"
            + (f" --member {member}" if member is not None else "")
            + (" --pending" if pending else "")
        ),
        as_json=as_json,
    )
    if as_json:
        return
    for d in found:
        task = " ".join(d["task"].split())
        cols = [d["delegation_id"], f"{d['caller']} -> {d['callee']}", d["state"]]
        cols.append(task if len(task) <= 60 else task[:59] + "…")
        print("\t".join(_p(c) for c in cols))
    if not found:
        err.print("no delegations")


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
            f"[{_when(item['at'])}] {_p(item['event']):<13} {_p(item['from'])} -> "
            f"{_p(item['to'])} {_p(item['kind'])}: {_p(item['summary'])}{_p(detail)}",
            flush=True,
        )

    async def run(c: Client) -> None:
        async for item in c.team_events(team, after=after):
            show(plain(item))

    with suppress(KeyboardInterrupt):
        _run(_with(client, run))
        # a hub ends a team's stream only when it stops
        _fail("the hub ended the stream: it is shutting down; run tail again once it is back")


from backchannel.interfaces import cli_agents, cli_sessions  # noqa: E402

cli_agents.register(app)  # hook, mcp, attach
cli_sessions.register(app)  # init, session open|list|event|terminate

from backchannel.interfaces import cli_budget  # noqa: E402  (registers budget)

cli_budget.register(app)

from backchannel.interfaces import cli_backup  # noqa: E402  (registers backup)

cli_backup.register(app)


def _escape_what_stdout_cannot_encode() -> None:
    """Print a character that stdout's encoding lacks as its escape (``\\U0001f600``).
    A stdout that is not UTF-8 (the C locale with UTF-8 mode off, ``PYTHONIOENCODING=
    ascii`` or ``latin-1``) raised UnicodeEncodeError at the first emoji of a message,
    a traceback instead of the inbox, whose messages then came back unacknowledged;
    UTF-8 mode's ``surrogateescape`` would write bytes that are not UTF-8. ``--json``
    prints ASCII, so it is the same whatever the encoding."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors != "backslashreplace":
            with suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


def main() -> None:
    # a closed stdout (``| head``) is not an error worth a traceback; ``serve`` puts
    # SIGPIPE back to ignored, so a client hanging up never ends the hub
    with suppress(AttributeError):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _escape_what_stdout_cannot_encode()
    problem = _argv_not_utf8(sys.argv[1:])
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    app()
