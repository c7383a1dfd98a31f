"""The CLI's conventions and its honesty about where it goes, as a user meets them:
real subprocesses against a real ``serve``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command

from backchannel.interfaces.cli import app
from tests.conftest import BIN, Server


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    return subprocess.run(
        [str(BIN), *args],
        capture_output=True,
        text=True,
        env={**base, "COLUMNS": "60", **(env or {})},
        cwd=cwd,
        input=input,
        timeout=60,
    )


def test_no_store_is_invented_in_the_current_directory(tmp_path: Path) -> None:
    r = run("team", "create", "alpha", cwd=tmp_path)
    assert r.returncode == 1
    assert "no hub found" in r.stderr
    for way_out in ("backchannel serve", "BACKCHANNEL_URL", "BACKCHANNEL_HOME", "backchannel init"):
        assert way_out in r.stderr
    assert "\n" not in r.stderr.strip(), "one line, never wrapped when not a terminal"
    assert not (tmp_path / ".backchannel").exists()
    where = run("status", cwd=tmp_path)
    assert where.returncode == 1
    assert "no hub found" in where.stderr
    # saying so creates one: init, then the same command works on that store
    assert run("init", cwd=tmp_path).returncode == 0
    assert (tmp_path / ".backchannel" / "backchannel.db").exists()
    assert (tmp_path / ".backchannel").stat().st_mode & 0o077 == 0
    assert run("team", "create", "alpha", cwd=tmp_path).returncode == 0
    here = run("status", "--json", cwd=tmp_path)
    info = json.loads(here.stdout)
    assert (info["kind"], info["identity"]) == ("store", None)
    assert info["found_by"].startswith("the store in")


def test_status_says_which_hub_and_who(server: Server, tmp_path: Path) -> None:
    env = {"BACKCHANNEL_HOME": str(server.home)}
    r = run("status", env=env)
    assert r.returncode == 0, r.stderr
    assert f"hub: {server.url}" in r.stdout
    assert "server.json" in r.stdout
    assert "you are: the administrator" in r.stdout
    tok = run("team", "create", "crew", env=env).stdout.strip()
    me = json.loads(run("status", "--json", env={**env, "BACKCHANNEL_TOKEN": tok}).stdout)
    assert me["identity"]["name"] == "user" and me["identity"]["team"] == "crew"
    assert me["reachable"] is True
    verbose = run("-v", "team", "list", env=env)
    assert f"using hub {server.url}, found by" in verbose.stderr
    assert verbose.stdout.split() == ["crew"]
    bad = run("status", env={**env, "BACKCHANNEL_TOKEN": "bc_nobody"})
    assert bad.returncode == 1
    assert "token is refused" in bad.stderr


def test_sessions_timers_inbox_and_links_from_the_shell(server: Server) -> None:
    env = {"BACKCHANNEL_HOME": str(server.home)}
    user = run("team", "create", "crew", env=env).stdout.strip()
    agent = run("member", "add", "crew", "agent", env=env).stdout.strip()
    as_user = {**env, "BACKCHANNEL_TOKEN": user}
    as_agent = {**env, "BACKCHANNEL_TOKEN": agent}

    assert json.loads(run("session", "list", "--json", env=as_user).stdout) == []
    assert json.loads(run("links", "--json", env=as_user).stdout) == []
    sid = run("session", "open", env=as_agent).stdout.strip()
    assert sid
    started = run("session", "event", sid, "turn_start", "working", env=as_agent)
    assert started.returncode == 0, started.stderr
    later = run(
        "timer",
        "set",
        "check",
        "30",
        "is user there",
        "--target",
        "user",
        "--session",
        sid,
        env=as_agent,
    )
    assert later.returncode == 0, later.stderr
    timers = json.loads(run("timer", "list", "--json", env=as_agent).stdout)
    assert [(t["session"], t["intent"]) for t in timers] == [(sid, "check")]
    assert run("timer", "cancel", later.stdout.strip(), env=as_agent).returncode == 0
    assert json.loads(run("timer", "list", "--json", env=as_agent).stdout) == []
    timer = run(
        "timer", "set", "anchor", "0.02", "back to the task", "--session", sid, env=as_agent
    )
    assert timer.returncode == 0, timer.stderr
    stop = run("session", "event", sid, "agent_stop", "done for now", env=as_agent)
    assert json.loads(stop.stdout)["state"] == "idle"
    # the timer fires between turns, into the session: `inbox --session` reads it
    got = json.loads(run("inbox", "--session", sid, "--wait", "20", "--json", env=as_agent).stdout)
    timer_msgs = [m for m in got if m["kind"] == "timer"]
    assert timer_msgs and timer_msgs[0]["text"].startswith("ANCHOR: back to the task")
    assert timer_msgs[0]["from"] == "hub"
    # the human, in a turn of their own, opens a link to the agent with a first send
    mine = run("session", "open", env=as_user).stdout.strip()
    assert run("session", "event", mine, "turn_start", env=as_user).returncode == 0
    for text in ("over to you", "and another thing"):  # the second goes over the link
        sent = run("send", "agent", text, env=as_user)
        assert sent.returncode == 0, sent.stderr  # never held to the agents' anchor rule
    found = json.loads(run("links", "--json", env=as_user).stdout)
    assert [(x["initiator"], x["responder"], x["state"]) for x in found] == [
        ("user", "agent", "open")
    ]
    ended = run("session", "terminate", sid, env=as_agent)
    assert ended.returncode == 0, ended.stderr
    assert "terminated" in ended.stderr


def test_an_agent_held_by_the_anchor_rule_gets_the_cli_way_out(server: Server) -> None:
    env = {"BACKCHANNEL_HOME": str(server.home)}
    run("team", "create", "crew", env=env)
    a = {**env, "BACKCHANNEL_TOKEN": run("member", "add", "crew", "a", env=env).stdout.strip()}
    run("member", "add", "crew", "b", env=env)
    sid = run("session", "open", env=a).stdout.strip()
    run("session", "event", sid, "turn_start", env=a)
    assert run("send", "b", "first: opens the link", env=a).returncode == 0
    held = run("send", "b", "second: needs an anchor", env=a)
    assert held.returncode == 1
    assert f"backchannel timer set anchor 10 'return to <your task>' --session {sid}" in held.stderr


def test_conventions(server: Server) -> None:
    env = {"BACKCHANNEL_HOME": str(server.home)}
    version = run("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("backchannel 0.")
    short = run("tail", "-h")
    assert short.returncode == 0
    assert "Team to watch [your own]." in short.stdout
    assert "<bool>" not in short.stdout
    usage = run("send", "--no-such-flag")
    assert usage.returncode == 2
    tok = run("team", "create", "crew", env=env).stdout.strip()
    empty = run("send", "user", "  ", env={**env, "BACKCHANNEL_TOKEN": tok})
    assert empty.returncode == 2
    assert "empty" in empty.stderr
    listings = [
        ("team", "list", "--json"),
        ("member", "list", "crew", "--json"),
        ("inbox", "--json"),
        ("timer", "list", "--json"),
        ("links", "--json"),
        ("session", "list", "--json"),
        ("delegations", "--json"),
        ("budget", "list", "crew", "--json"),
    ]
    for args in listings:
        r = run(*args, env={**env, "BACKCHANNEL_TOKEN": tok} if args[0] != "team" else env)
        assert r.returncode == 0, (args, r.stderr)
        assert isinstance(json.loads(r.stdout), list), args
    assert run("inbox", "--json", env={**env, "BACKCHANNEL_TOKEN": tok}).stdout.strip() == "[]"


def test_delegation_without_a_session_says_delegation(server: Server) -> None:
    import httpx

    env = {"BACKCHANNEL_HOME": str(server.home)}
    run("team", "create", "crew", env=env)
    tok = run("member", "add", "crew", "lead", env=env).stdout.strip()
    run("member", "add", "crew", "worker", env=env)
    r = httpx.post(
        f"{server.url}/v1/delegations",
        json={"to": "worker", "task": "count"},
        headers={"Authorization": f"Bearer {tok}"},
    )
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert "delegation" in message and "timer" not in message
    assert "backchannel session open" in message


def test_text_that_is_not_utf8_is_refused_by_name_not_with_a_traceback(server: Server) -> None:
    env = {"BACKCHANNEL_HOME": str(server.home)}
    tok = run("team", "create", "crew", env=env).stdout.strip()
    base = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    as_user = {**base, **env, "BACKCHANNEL_TOKEN": tok}
    sid = run("session", "open", env=as_user).stdout.strip()

    def raw(*args: str | bytes, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(BIN), *args], capture_output=True, env=as_user, input=stdin, timeout=60
        )

    for args, stdin in [
        (("send", "user", "-"), b"caf\xe9 latin-1\n"),
        (("session", "event", sid, "thought", "-"), b"caf\xe9"),
        (("send", "user", b"caf\xe9"), b""),
        (("send", b"us\xffer", "hello"), b""),
    ]:
        r = raw(*args, stdin=stdin)
        assert r.returncode == 2, (args, r.stderr)
        assert b"Traceback" not in r.stderr, args
        assert b"not UTF-8" in r.stderr, (args, r.stderr)
    piped = raw("send", "user", "-", stdin=b"caf\xe9")
    assert b"iconv" in piped.stderr  # the way out
    assert raw("send", "user", "-", stdin="café".encode()).returncode == 0
    got = json.loads(run("inbox", "--json", env=as_user).stdout)
    assert [m["text"] for m in got] == ["café"]


def test_nan_and_inf_are_refused_as_numbers_on_the_command_line(server: Server) -> None:
    env = {"BACKCHANNEL_HOME": str(server.home)}
    run("team", "create", "crew", env=env)
    agent = {**env, "BACKCHANNEL_TOKEN": run("member", "add", "crew", "a", env=env).stdout.strip()}
    sid = run("session", "open", env=agent).stdout.strip()
    for args, option in [
        (("inbox", "--wait", "nan"), "'--wait'"),
        (("timer", "set", "anchor", "inf", "note", "--session", sid), "'minutes'"),
        (("timer", "set", "anchor", "nan", "note", "--session", sid), "'minutes'"),
        (("run", "team.yaml", "task", "--timeout", "nan"), "'--timeout'"),
        (("serve", "--port", "0", "--lease", "nan"), "'--lease'"),
        (("serve", "--port", "0", "--dispatch-lease", "inf"), "'--dispatch-lease'"),
        (("serve", "--port", "0", "--retention-days", "nan"), "'--retention-days'"),
    ]:
        r = run(*args, env=agent)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr, args
        assert f"Invalid value for {option}: must be a finite number" in r.stderr, args
    assert json.loads(run("timer", "list", "--json", env=agent).stdout) == []


def test_attach_never_wraps_its_lines(tmp_path: Path) -> None:
    project = tmp_path / ("a-project-directory-with-a-rather-long-name-" * 2)
    project.mkdir()
    url = "http://127.0.0.1:8765"
    r = run(
        "attach", "claude-code", "--team", "demo", "--member", "lead", "--dir", str(project),
        "--url", url,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"Attached claude-code in {project} as demo/lead (hub {url})." in r.stderr
    assert f"  cd {project} && claude\n" in r.stderr


def test_a_hub_url_that_is_neither_http_nor_a_store_is_named(tmp_path: Path) -> None:
    for args, env in [
        (("team", "list", "--store", "bogus://x"), {}),
        (("send", "user", "hi", "--url", "127.0.0.1:8765"), {"BACKCHANNEL_TOKEN": "bc_x"}),
        (("inbox",), {"BACKCHANNEL_TOKEN": "bc_x", "BACKCHANNEL_URL": "localhost:8765"}),
        (("status",), {"BACKCHANNEL_URL": "localhost:8765"}),
    ]:
        r = run(*args, env=env, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr, args
        assert "cannot tell where" in r.stderr and "http(s)://HOST:PORT" in r.stderr, args
        assert "token" not in r.stderr, args


def test_status_says_a_store_that_does_not_open_does_not_answer(tmp_path: Path) -> None:
    (tmp_path / "notes.db").write_text("not the pages of a database\n")
    r = run("status", "--store", f"sqlite:///{tmp_path}/notes.db", cwd=tmp_path)
    assert r.returncode == 1
    assert "answers: no" in r.stdout
    assert "the store does not open:" in r.stderr and "not a backchannel store" in r.stderr
    # asked about a store that is not there yet, status says so and makes nothing
    absent = run("status", "--store", f"sqlite:///{tmp_path}/new/hub.db", cwd=tmp_path)
    assert absent.returncode == 1
    assert "there is no store at" in absent.stderr and "backchannel init" in absent.stderr
    assert not (tmp_path / "new").exists()
    assert run("init", "--store", f"sqlite:///{tmp_path}/hub.db", cwd=tmp_path).returncode == 0
    good = run("status", "--store", f"sqlite:///{tmp_path}/hub.db", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert "answers: yes" in good.stdout


def test_another_hubs_admin_token_is_named_with_the_way_out(server: Server, tmp_path: Path) -> None:
    assert run("init", cwd=tmp_path).returncode == 0  # a data directory of another hub
    stale = tmp_path / ".backchannel" / "admin.token"
    (tmp_path / "team.yaml").write_text("team: t\nmembers:\n  - {name: a, policy: echo}\n")
    for args in [("team", "list"), ("status",), ("run", "team.yaml", "task")]:
        r = run(*args, "--url", server.url, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stderr)
        assert f"the admin token in {stale} is not this hub's" in r.stderr, args
        assert "BACKCHANNEL_HOME" in r.stderr, args
    own = run("team", "list", "--url", server.url, "--token", "bc_nobody", cwd=tmp_path)
    assert own.returncode == 1
    assert "admin.token" not in own.stderr  # a token given is not the file's


def test_serve_names_a_port_or_text_limit_out_of_range_and_a_host_not_its_own(
    tmp_path: Path,
) -> None:
    home = str(tmp_path / "data")
    port = run("serve", "--port", "70000", "--home", home)
    assert port.returncode == 2
    assert "Traceback" not in port.stderr
    assert "Invalid value for '--port'" in port.stderr
    # a hub that would refuse every message as too large is no hub to start
    for text in ("0", "-5"):
        none_fit = run("serve", "--port", "0", "--max-text", text, "--home", home)
        assert none_fit.returncode == 2
        assert "Invalid value for '--max-text'" in none_fit.stderr
    host = run("serve", "--host", "999.1.1.1", "--port", "0", "--home", home)
    assert host.returncode == 1
    assert "cannot listen on 999.1.1.1:0" in host.stderr
    assert "give --host an address of this machine" in host.stderr
    assert "--port" not in host.stderr


def test_serve_refuses_a_push_lease_under_its_floor_naming_the_floor(tmp_path: Path) -> None:
    """A 2 s push lease ran out on a busy store while its hub was alive (the renewal,
    every quarter of it, took over a second): pushing stopped and started again. Such a
    lease is refused at start, naming the floor and the value to use instead."""
    home = str(tmp_path / "data")
    for lease in ("2", "0", "4.9"):
        r = run("serve", "--port", "0", "--dispatch-lease", lease, "--home", home)
        assert r.returncode == 2, (lease, r.stderr)
        assert "Traceback" not in r.stderr
        err = " ".join(r.stderr.replace("│", " ").split())
        assert "Invalid value for --dispatch-lease" in err, err
        assert "at least 5 seconds" in err, err
        assert "use --dispatch-lease 5" in err, err


def test_a_data_directory_that_is_a_file_is_named_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    home = str(tmp_path / "a-file")
    for args in [("serve", "--port", "0"), ("init",), ("team", "list"), ("status",)]:
        r = run(*args, env={"BACKCHANNEL_HOME": home})
        assert r.returncode == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr, args
        assert f"the data directory {home} is not a directory" in r.stderr, args
    under = run("init", "--home", str(tmp_path / "a-file" / "data"))
    assert under.returncode == 1
    assert "Traceback" not in under.stderr
    assert "cannot create the data directory" in under.stderr


def test_a_command_gives_up_on_a_hub_that_breaks_every_connection_within_a_second(
    tmp_path: Path,
) -> None:
    """The SDK rides out a hub it cannot reach for ten seconds (a restart); a person at
    the command line is told at once instead: a send is tried again within a second,
    then the command says its answer was lost (each try went out: the hub may have
    stored it) and how to send it again once."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[float] = []

    def cut_every_connection() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1.0)
            conn.recv(65536)  # the request went out; its answer never comes
            conn.close()

    threading.Thread(target=cut_every_connection, daemon=True).start()
    try:
        run = subprocess.run(
            [str(BIN), "send", "--url", f"http://127.0.0.1:{port}", "--token", "bca_x", "b", "hi"],
            env={**os.environ, "BACKCHANNEL_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        listener.close()
    assert run.returncode == 1
    assert f"was lost on the way back from the hub at http://127.0.0.1:{port}" in run.stderr
    assert "run the same command with --id msg_" in run.stderr, run.stderr
    # tried again (the answer was lost, the send carries its id), but not for ten seconds:
    # pauses of 0.2 s doubling make 3 tries in one second and 8 in ten
    assert 2 <= len(accepted) <= 4, accepted


def test_a_hub_url_in_capitals_or_with_a_query_is_read_as_written_or_named(
    tmp_path: Path,
) -> None:
    # a URL's scheme is case-insensitive (RFC 3986); a query, a fragment or a user and
    # password in the hub's URL has no place there and would be sent mangled
    from backchannel.client import Client
    from backchannel.errors import InvalidRequest

    assert Client("HTTP://127.0.0.1:8765/").hub_url == "http://127.0.0.1:8765"
    assert Client("Https://hub.example:443/team/").hub_url == "https://hub.example:443/team"
    for url, part in [
        ("http://127.0.0.1:8765/?team=a", "a query"),
        ("http://127.0.0.1:8765/#x", "a fragment"),
        ("http://me:pw@127.0.0.1:8765", "a user name or password"),
    ]:
        with pytest.raises(InvalidRequest, match=part) as refused:
            Client(url)
        assert "pw" not in refused.value.message
    r = run("status", env={"BACKCHANNEL_URL": "HTTP://127.0.0.1:9"}, cwd=tmp_path)
    assert "cannot tell where" not in r.stderr, r.stderr
    assert "hub: http://127.0.0.1:9" in r.stdout, r.stdout


#: The number of ``read`` in /proc/PID/syscall, per machine: how a test knows a command
#: is blocked reading its stdin without waiting on a clock.
_READ_SYSCALL = {"x86_64": 0, "aarch64": 63}


def _reading_stdin(pid: int) -> bool:
    import platform

    number = _READ_SYSCALL[platform.machine()]
    return Path(f"/proc/{pid}/syscall").read_text().startswith(f"{number} 0x0 ")


@pytest.mark.skipif(
    not Path("/proc/self/syscall").exists()
    or __import__("platform").machine() not in _READ_SYSCALL,
    reason="needs Linux's /proc/PID/syscall",
)
def test_ctrl_c_in_the_hook_and_the_mcp_server_exits_130_without_a_traceback(
    server: Server,
) -> None:
    import signal

    from backchannel.testing import eventually_blocking

    env = {"BACKCHANNEL_HOME": str(server.home)}
    run("team", "create", "crew", env=env)
    token = run("member", "add", "crew", "a", env=env).stdout.strip()
    base = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    agent = {**base, "BACKCHANNEL_URL": server.url, "BACKCHANNEL_TOKEN": token}
    hello = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
    )
    for args in (("hook", "claude-code"), ("mcp",)):
        with subprocess.Popen(
            [str(BIN), *args],
            env=agent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                if args == ("mcp",):
                    proc.stdin.write(hello + "\n")
                    proc.stdin.flush()
                    assert '"id":1' in proc.stdout.readline()  # it answered the handshake
                eventually_blocking(
                    lambda: _reading_stdin(proc.pid), what=f"{args[0]} to read its stdin"
                )
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
            assert proc.returncode == 130, (args, proc.returncode, err)
            assert "Traceback" not in err, (args, err)


def test_an_admin_command_given_a_members_token_names_it_and_the_way_out(
    server: Server,
) -> None:
    # a terminal that exported an agent's token (as attaching one has you do) and then
    # manages the team from the hub's host
    token = server.team("crew", "lead")["lead"]
    env = {"BACKCHANNEL_TOKEN": token, "BACKCHANNEL_HOME": str(server.home)}
    r = run("member", "add", "crew", "worker", "--url", server.url, env=env)
    assert r.returncode == 1, r.stderr
    assert "member crew/lead's" in r.stderr
    assert "unset BACKCHANNEL_TOKEN" in r.stderr
    assert str(server.home / "admin.token") in r.stderr
    assert "$BACKCHANNEL_HOME" not in r.stderr
    del env["BACKCHANNEL_TOKEN"]  # the way out works
    assert run("member", "add", "crew", "worker", "--url", server.url, env=env).returncode == 0


def test_an_admin_command_away_from_the_hubs_directory_names_the_ways_to_its_token(
    server: Server, tmp_path: Path
) -> None:
    """The README's "from elsewhere set BACKCHANNEL_URL": an admin command there finds no
    admin token. It said "run on the hub's host", which the user already was; it names
    the directory serve runs in and BACKCHANNEL_HOME, and that way out works."""
    r = run("team", "create", "elsewhere", env={"BACKCHANNEL_URL": server.url}, cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    said = " ".join(r.stderr.split())
    assert str(tmp_path / ".backchannel" / "admin.token") in said
    assert "the directory `backchannel serve` was started in" in said
    assert "BACKCHANNEL_HOME" in said and "BACKCHANNEL_TOKEN" in said
    env = {"BACKCHANNEL_URL": server.url, "BACKCHANNEL_HOME": str(server.home)}
    assert run("team", "create", "elsewhere", env=env, cwd=tmp_path).returncode == 0


def test_each_command_groups_help_names_every_command_it_holds() -> None:
    """``backchannel -h`` and ``backchannel member -h`` describe a group by what it does:
    a group whose line says "Create and list teams" while it also removes them hides
    that command from a newcomer reading the help."""
    groups = {n: c for n, c in getattr(get_command(app), "commands", {}).items()
              if getattr(c, "commands", None)}  # fmt: skip
    assert {"team", "member", "timer", "session", "budget"} <= set(groups)
    unnamed = {}
    for name, group in groups.items():
        shown = run(name, "-h")
        assert shown.returncode == 0, shown.stderr
        said = shown.stdout.split("Options:")[0].split("\n", 1)[1].lower()
        subs = list(getattr(group, "commands", {}))
        missing = [sub for sub in subs if not re.search(rf"\b{sub.split('-')[0]}", said)]
        if missing:
            unnamed[name] = missing
    assert unnamed == {}, unnamed


def test_help_lists_each_command_with_its_whole_first_sentence() -> None:
    """``backchannel -h`` (and a group's) told a newcomer "Run the hub: HTTP API, live
    streams and the data..." and "Remove a member: mail still waiting for it becomes
    dead...": each command's line is its whole first sentence, wrapped, never cut."""
    root = get_command(app)
    groups = [("", root)] + [
        (n, c) for n, c in getattr(root, "commands", {}).items() if getattr(c, "commands", None)
    ]
    cut = {}
    for name, group in groups:
        shown = run(*([name] if name else []), "-h")
        assert shown.returncode == 0, shown.stderr
        listing = " ".join(shown.stdout.split("Commands:")[1].split())
        for sub, cmd in getattr(group, "commands", {}).items():
            first = " ".join(cmd.get_short_help_str(limit=1_000).split())
            if f"{sub} {first}" not in listing or first.endswith("..."):
                cut[f"{name} {sub}".strip()] = first
    assert cut == {}, cut


def test_a_value_outside_an_options_closed_set_is_a_usage_error_naming_the_choices(
    server: Server, tmp_path: Path
) -> None:
    """``member add --kind claude`` went to the hub and came back as its validation error
    (exit 1, pydantic's words). Every option or argument with a closed set of values is
    checked by the command line: exit 2, the option named with the values it takes and
    the closest ones, nothing asked of the hub and nothing written."""
    tokens = server.team("demo", "worker")
    hub = {"BACKCHANNEL_URL": server.url}
    project = tmp_path / "project"
    project.mkdir()
    cases = [
        (
            ("member", "add", "demo", "newbie", "--kind", "claude"),
            {**hub, "BACKCHANNEL_TOKEN": server.admin_token},
            "Invalid value for '--kind': 'claude' is not one of: claude-code, codex, gemini, "
            "llm, http, human (did you mean 'claude-code'",
        ),
        (
            ("timer", "set", "anchr", "5", "back to the report"),
            {**hub, "BACKCHANNEL_TOKEN": tokens["worker"]},
            "Invalid value for 'intent': 'anchr' is not one of: anchor, check, wait "
            "(did you mean 'anchor'?)",
        ),
        (
            ("attach", "claude", "--team", "demo", "--member", "worker", "--dir", str(project)),
            {**hub, "BACKCHANNEL_TOKEN": tokens["worker"]},
            "Invalid value for 'runtime': 'claude' is not one of: claude-code, codex, gemini",
        ),
    ]
    for args, env, said in cases:
        r = run(*args, env=env)
        assert r.returncode == 2, (args, r.stderr)
        assert said in " ".join(r.stderr.split()), (args, r.stderr)
    assert list(project.iterdir()) == []
    with server.client() as admin:
        names = [m["name"] for m in admin.get("/v1/teams/demo/members").json()["members"]]
    assert "newbie" not in names
    ok = run("member", "add", "demo", "newbie", "--kind", "codex", env=cases[0][1])
    assert ok.returncode == 0, ok.stderr


def test_a_client_command_loads_no_hub() -> None:
    """The CLI and the SDK talk to a hub over HTTP: a command (``send``, ``inbox``...)
    that loaded the hub's own code started a quarter of a second later each time, for
    nothing. Ids and outgoing messages come from ``backchannel.core``."""
    probe = (
        "import sys, backchannel.interfaces.cli, backchannel.client\n"
        "print(sorted(m for m in sys.modules if m.startswith(('backchannel.hub', "
        "'backchannel.stores.sqlite', 'backchannel.stores.postgres', 'fastapi'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]", loaded
