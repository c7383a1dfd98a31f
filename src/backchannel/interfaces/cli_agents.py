"""CLI commands for agent runtimes: ``hook``, ``mcp`` and ``attach``.

``hook`` is run by the runtime itself, so it never fails the agent: it always exits 0
and prints a JSON object (``{}`` when it has nothing to say); why a call had no effect
goes to stderr, and to the hub's log. It forwards the payload to the hub's
``POST /v1/hooks/{runtime}`` when the hub is a server, or applies it in this process on
the data directory's store otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from backchannel import config
from backchannel.client import Client
from backchannel.errors import BackchannelError
from backchannel.interfaces.cli_options import AsOpt, HomeOpt, UrlOpt, choice
from backchannel.interfaces.cli_options import MemberTokenOpt as TokenOpt

err = Console(stderr=True, highlight=False, soft_wrap=True)


def _hub_url(url: str | None, home: Path | None) -> str:
    """The hub or existing store (never a new one); ``InvalidRequest`` names the ways out."""
    from backchannel.interfaces.cli_hub import locate

    return locate(url, home).url


# -- hook ---------------------------------------------------------------------------------


def run_hook(
    runtime: str,
    raw: str,
    *,
    url: str | None,
    token: str | None,
    home: Path | None = None,
    expect: str | None = None,
) -> tuple[dict[str, Any], str | None, list[str]]:
    """Apply one hook call; returns the answer to print, why it had no effect, and the
    ids it hands over (to record for the session once printed: :mod:`..runtimes.seen`)."""
    from backchannel.runtimes import RUNTIMES

    if runtime not in RUNTIMES:
        return {}, f"unknown runtime {runtime!r}; use one of: {', '.join(RUNTIMES)}", []
    if not token:
        return {}, "BACKCHANNEL_TOKEN is not set; export this agent's member token", []
    target = _hub_url(url, home)
    raw, note = _enriched(runtime, raw)
    if target.startswith(("http://", "https://")):
        answer, problem, handed = _forward(runtime, raw, target, token, expect)
    else:
        answer, problem, handed = asyncio.run(_local_hook(runtime, raw, target, token, expect))
    return answer, problem or note, handed


def _enriched(runtime: str, raw: str) -> tuple[str, str | None]:
    """The payload with the closing text read from this machine's transcript when it
    lacks it (the hub never reads a file a hook names) and the session's record of what
    hook answers showed it, and the runtime process it runs under
    (:mod:`backchannel.runtimes.liveness`); a bad payload goes as it is."""
    from backchannel.runtimes.liveness import add_runtime
    from backchannel.runtimes.seen import add_record
    from backchannel.runtimes.transcripts import enrich

    try:
        payload = json.loads(raw)
    except ValueError:
        return raw, None
    filled, note = enrich(runtime, payload)
    filled = add_runtime(add_record(runtime, filled))
    return (raw if filled is payload else json.dumps(filled)), note


def _forward(
    runtime: str, raw: str, url: str, token: str, expect: str | None
) -> tuple[dict[str, Any], str | None, list[str]]:
    from backchannel.client._transport import hub_request
    from backchannel.interfaces.hook_command import DEADLINE_S, unreachable
    from backchannel.reach import not_the_hub
    from backchannel.runtimes.common import PROBLEM_HEADER
    from backchannel.runtimes.seen import DELIVERED_HEADER, delivered_ids

    try:
        resp = hub_request(
            "POST",
            f"{url.rstrip('/')}/v1/hooks/{runtime}",
            content=raw.encode("utf-8", "surrogateescape"),
            params={"as": expect} if expect else None,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            # the lean hook's budget: a runtime kills a hook at its timeout (30 s)
            timeout=httpx.Timeout(DEADLINE_S, connect=5.0),
        )
    except httpx.TimeoutException:
        return {}, f"the hub at {url} did not answer within {DEADLINE_S:g} s", []
    except httpx.HTTPError as exc:
        return {}, unreachable(url, exc), []
    try:
        answer = resp.json()
    except ValueError:
        answer = None
    error = answer.get("error") if isinstance(answer, dict) else None
    if resp.status_code >= 400 or not isinstance(answer, dict):
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return {}, f"hub answered {resp.status_code}: {error['message']}", []
        why = not_the_hub(resp.status_code, resp.content[:2000])
        return {}, f"the hub at {url} did not answer the hook: {why}", []
    handed = delivered_ids(resp.headers.get(DELIVERED_HEADER))
    return answer, resp.headers.get(PROBLEM_HEADER), handed


async def _local_hook(
    runtime: str, raw: str, store_url: str, token: str, expect: str | None
) -> tuple[dict[str, Any], str | None, list[str]]:
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        return {}, f"hook payload is not JSON ({exc})", []
    async with Client(store_url, token) as client:
        result = await client.hook(runtime, payload, expect=expect)
        return dict(result.answer), result.problem, list(result.delivered)


def hook(
    runtime: Annotated[str, typer.Argument(help="claude-code, codex or gemini")],
    payload: Annotated[
        str | None,
        typer.Argument(help="The hook JSON as an argument (Codex notify); else read from stdin."),
    ] = None,
    as_: AsOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    keep_alive: Annotated[
        bool,
        typer.Option(
            "--keep-alive",
            help="Make sure a keeper beats for this runtime while it runs (a runtime with "
            "no `backchannel mcp` of its own, such as one on the HTTP MCP server).",
        ),
    ] = False,
) -> None:
    """A command hook: the runtime's hook JSON on stdin, its answer on stdout. Always
    exits 0; why a call had no effect goes to stderr."""
    from backchannel.interfaces.hook_command import read_payload

    answer: dict[str, Any] = {}
    problem: str | None
    handed: list[str] = []
    raw = ""
    logging.getLogger("backchannel").setLevel(logging.ERROR)  # reasons are printed below
    try:
        raw = payload if payload is not None else read_payload(sys.stdin)
        answer, problem, handed = run_hook(
            runtime, raw, url=url, token=token, home=home, expect=as_
        )
    except BackchannelError as exc:
        problem = exc.message
    except Exception as exc:  # a broken hook must never block the agent
        problem = f"internal error: {type(exc).__name__}: {exc}"
    print(json.dumps(answer), flush=True)
    if handed:  # printed: now the session has them
        _remember(runtime, raw, handed)
    if keep_alive:
        _keep_alive(url, home, token)
    if problem:
        print(f"backchannel hook {runtime}: {problem}", file=sys.stderr, flush=True)


def _keep_alive(url: str | None, home: Path | None, token: str | None) -> None:
    """``--keep-alive`` (:func:`backchannel.interfaces.hook_command.keep_alive`): only a
    hub served over HTTP takes beats."""
    from backchannel.interfaces.hook_command import keep_alive

    try:
        target = _hub_url(url, home)
    except BackchannelError:
        return
    if target.startswith(("http://", "https://")):
        keep_alive(target, token)


def _remember(runtime: str, raw: str, handed: list[str]) -> None:
    from backchannel.runtimes.seen import remember

    try:
        sid = json.loads(raw).get("session_id")
    except (ValueError, AttributeError):
        return
    if isinstance(sid, str) and sid:
        remember(runtime, sid, handed)


# -- mcp ----------------------------------------------------------------------------------


def mcp(
    session: Annotated[
        str | None,
        typer.Option(envvar="BACKCHANNEL_SESSION", help="The session the tools act for."),
    ] = None,
    as_: AsOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """The MCP server on stdio, acting as the member whose token is in BACKCHANNEL_TOKEN."""
    from backchannel.interfaces.mcp import serve_stdio

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    if not token:
        err.print("[red]error:[/red] set BACKCHANNEL_TOKEN to this agent's member token")
        raise typer.Exit(1)
    expect = tuple(as_.split("/", 1)) if as_ else ()
    try:
        target = _hub_url(url, home)
        asyncio.run(serve_stdio(Client(target, token), session=session, expect=expect))
    except BackchannelError as exc:
        err.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass


# -- attach -------------------------------------------------------------------------------


def _executable() -> str:
    """How project files should run this command: by name when that is this program."""
    me = Path(sys.argv[0]).resolve()
    found = shutil.which("backchannel")
    if found and Path(found).resolve() == me:
        return "backchannel"
    return str(me) if me.name == "backchannel" else "backchannel"


def _runtime_names() -> list[str]:
    from backchannel.runtimes import RUNTIMES

    return list(RUNTIMES)


def attach(
    runtime: Annotated[
        str, typer.Argument(callback=choice(_runtime_names), help="claude-code, codex or gemini")
    ],
    team: Annotated[str, typer.Option(help="The member's team.")],
    member: Annotated[str, typer.Option(help="The member this agent runs as.")],
    directory: Annotated[
        Path, typer.Option("--dir", help="The project directory.", file_okay=False)
    ] = Path("."),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the unified diff; write nothing.")
    ] = False,
    http: Annotated[
        bool, typer.Option("--http", help="MCP (and Claude Code hooks) over HTTP, not commands.")
    ] = False,
    trust_hooks: Annotated[
        bool,
        typer.Option(
            "--trust-hooks",
            help="Codex: also record your trust of backchannel's hooks in your Codex config.",
        ),
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Write the MCP server entry and the hooks into the project's own config files,
    merged with what is there (backed up first). The token is never written."""
    from backchannel.runtimes.attach import AttachOptions, apply, instructions, plan

    try:
        hub = _hub_url(url, home)
    except BackchannelError as exc:
        if url:  # a --url (or BACKCHANNEL_URL) no client could use: never written
            err.print("[red]error:[/red] ", end="")
            err.print(f"{exc.message}; nothing written", markup=False)
            raise typer.Exit(1) from None
        hub = ""
    if url and hub and not hub.startswith(("http://", "https://")):
        err.print("[red]error:[/red] ", end="")
        err.print(
            f"{config.redact_url(url)!r} is a store, and the agent reaches its hub over "
            "HTTP: start `backchannel serve` on it and give its http(s)://HOST:PORT as "
            "--url (or BACKCHANNEL_URL); nothing written",
            markup=False,
        )
        raise typer.Exit(1)
    if not hub.startswith(("http://", "https://")):
        hub = _default_hub(home)
        if hub:  # an address nobody named or recorded: it gets no token (any local
            # process may listen there and answer /healthz as a hub does)
            err.print(
                f"the names were not checked: a token goes only to a hub named with --url "
                f"(or BACKCHANNEL_URL) or recorded by its `serve`. To check them against "
                f"this one, attach again with --url {hub}, or run `backchannel doctor` "
                "in the project once its agent's token is set",
                markup=False,
            )
        else:
            hub = config.default_hub_url()
    else:
        unknown = asyncio.run(_unknown_name(hub, team, member, token, home))
        if unknown is not None:
            err.print(f"[red]error:[/red] {unknown}; nothing written", markup=True)
            raise typer.Exit(1)
    opts = AttachOptions(
        team, member, directory.resolve(), hub.rstrip("/"), _executable(), http=http
    )
    try:
        changes = plan(runtime, opts)
    except BackchannelError as exc:
        err.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    if dry_run:
        diffs = [c.diff(opts.directory) for c in changes if c.changed]
        sys.stdout.write("".join(diffs))
        if not diffs:
            err.print("nothing to change")
        return
    try:
        done = apply(changes)
    except OSError as exc:  # a full disk, a file that cannot be written over
        why = exc.strerror or str(exc)
        if exc.filename:
            why = f"{exc.filename}: {why}"
        err.print("[red]error:[/red] ", end="")
        err.print(
            f"{why}. Each file is whole (written, or as it was); run `backchannel attach` "
            "again once that is fixed: it writes what is still missing",
            markup=False,
        )
        raise typer.Exit(1) from None
    for path, backup in done:
        note = f" (was saved as {backup.name})" if backup else ""
        err.print(f"wrote {path.relative_to(opts.directory)}{note}")
    if not done:
        err.print("already attached; nothing changed")
    err.print(instructions(runtime, opts, token))
    if runtime == "codex":
        from backchannel.runtimes.attach import codex_trust_note

        err.print(codex_trust_note(opts, grant=trust_hooks))


def _default_hub(home: Path | None) -> str:
    """No hub recorded (no ``server.json``, or one its server left behind): the default
    URL of ``serve`` when a hub answers there (asked briefly), said either way; "" when
    none answers. The files then point at the default URL, with the way to fix it."""
    from backchannel.client._transport import hub_request

    default = config.default_hub_url()
    recorded = config.home(home) / config.SERVER_FILE
    try:
        answer = hub_request("GET", f"{default}/healthz", timeout=2.0)
        found = answer.status_code == 200 and isinstance(answer.json().get("status"), str)
    except (httpx.HTTPError, ValueError, AttributeError):
        found = False
    if found:
        err.print(f"found a hub at {default} (none is recorded in {recorded})", markup=False)
        return default
    err.print(
        f"no hub answers at {default}, and none is recorded in {recorded}: the files point "
        f"at {default}. Start the hub there with `backchannel serve` (from the directory "
        "of its data, or with BACKCHANNEL_HOME set), or attach again with --url "
        "http://HOST:PORT (or BACKCHANNEL_URL) to use a hub elsewhere",
        markup=False,
    )
    return ""


async def _unknown_name(
    hub: str, team: str, member: str, token: str | None, home: Path | None
) -> str | None:
    """What is wrong with ``team``/``member`` when the hub can say: asked with the data
    directory's admin token when ``hub`` is the hub its ``server.json`` records, else
    with the member token at hand (of that team). A
    name mistyped on the command line would otherwise be written into the project,
    and the agent would run with every token refused by ``--as``. The hub not
    answering, or a token it does not take, checks nothing: attach may come first."""
    from backchannel import config
    from backchannel.core.messages import suggest
    from backchannel.errors import UnknownTeam

    def hint(name: str, known: list[str]) -> str:
        near = suggest(name, known)
        return f"; did you mean {' or '.join(map(repr, near))}?" if near else ""

    admin_token = None
    data_dir = config.home(home)
    recorded = config.read_server_info(data_dir) or {}
    with contextlib.suppress(BackchannelError, OSError, ValueError):
        if config.hub_http_url(str(recorded.get("url", ""))) == config.hub_http_url(hub):
            # the data directory's admin token is its own hub's, the one its server.json
            # records: another address (a hub elsewhere, a mistyped port) never gets it
            admin_token = config.admin_token(data_dir, create=False)
    for tok in (admin_token, token):
        if not tok:
            continue
        try:
            async with Client(hub, tok, timeout=5.0, retry_within=0.0) as c:
                me = await c.me()
                if me.admin:
                    teams = [t.name for t in await c.teams()]
                    if team not in teams:
                        return (
                            f"unknown team {team!r} on the hub at {hub}{hint(team, teams)} "
                            f"(`backchannel team create {team}` creates it)"
                        )
                elif me.team != team:
                    continue  # another team's member cannot see this one
                names = [m.name for m in await c.members(team)]
        except UnknownTeam:
            continue
        except (BackchannelError, ValueError):
            # not answering, the token refused, or an answer no hub gives (a process
            # that is not one): nothing to say
            continue
        if member in names:
            return None
        return (
            f"unknown member {member!r} in team {team!r}{hint(member, names)} "
            f"(`backchannel member add {team} {member} --kind ...` adds it)"
        )
    return None


def register(app: typer.Typer) -> None:
    """Add the agent commands to the ``backchannel`` CLI."""
    app.command()(hook)
    app.command("mcp")(mcp)
    app.command()(attach)
    from backchannel.interfaces.cli_doctor import doctor

    app.command()(doctor)
