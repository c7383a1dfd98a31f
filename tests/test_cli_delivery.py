"""A member's push delivery from the command line, as an administrator meets it: set when
the member is added (``member add --delivery``), changed or cleared later (``member set``),
shown with its secrets redacted (``member list``, ``member show``), each mistake named by
the CLI or the hub with the way out. Real subprocesses against a real ``serve``."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from backchannel.testing.waiting import eventually_blocking
from tests.conftest import Server, free_port, start_server
from tests.delivery.conftest_adapters import tmux_server
from tests.test_cli_conventions import run

#: The webhook services the ``server`` of these tests registers (a delivery naming
#: another is refused when set).
SERVICES = "billing=http://127.0.0.1:9,ops=http://127.0.0.1:9"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """``serve`` with :data:`SERVICES` registered, whose tmux sockets by name are in a
    directory of its own: a tmux server the machine runs (tests run inside tmux) is
    not the one its settings' panes are checked against."""
    (tmp_path / "tmux").mkdir()
    env = {"BACKCHANNEL_CALLBACKS": SERVICES, "TMUX_TMPDIR": str(tmp_path / "tmux")}
    srv = start_server(tmp_path / "home", env=env)
    try:
        yield srv
    finally:
        srv.stop()


def _admin(server: Server) -> dict[str, str]:
    return {"BACKCHANNEL_HOME": str(server.home)}


def _show(server: Server, team: str, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return run("member", "show", team, name, *extra, env=_admin(server))


def _delivery(server: Server, team: str, name: str) -> Any:
    r = _show(server, team, name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["delivery"]


def test_delivery_is_set_changed_and_cleared_from_the_cli(server: Server, tmp_path: Path) -> None:
    env = _admin(server)
    user = run("team", "create", "crew", env=env).stdout.strip()
    tmux = '{"type": "tmux", "target": "work:0.1", "session": "auto"}'
    added = run(
        "member", "add", "crew", "researcher", "--kind", "claude-code", "--delivery", tmux, env=env
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip().startswith("bc_")  # the token, still alone on stdout
    assert _delivery(server, "crew", "researcher") == json.loads(tmux)
    shown = _show(server, "crew", "researcher")
    assert "kind\tclaude-code" in shown.stdout
    assert 'delivery\t{"type": "tmux", "target": "work:0.1", "session": "auto"}' in shown.stdout

    # changed from a file on this machine, then from stdin
    setting = tmp_path / "hook.json"
    setting.write_text('{"type": "webhook", "service": "billing"}\n')
    r = run("member", "set", "crew", "researcher", "--delivery", f"@{setting}", env=env)
    assert r.returncode == 0, r.stderr
    assert '{"type": "webhook", "service": "billing"}' in r.stderr
    assert "member show crew researcher" in r.stderr  # where to see whether the push is up
    assert _delivery(server, "crew", "researcher") == {"type": "webhook", "service": "billing"}
    inbox = '{"type": "inbox-file", "team": "crew", "inbox": "researcher"}'
    r = run("member", "set", "crew", "researcher", "--delivery", "-", env=env, input=inbox)
    assert r.returncode == 0, r.stderr
    assert _delivery(server, "crew", "researcher") == json.loads(inbox)

    # cleared: the member pulls again
    r = run("member", "set", "crew", "researcher", "--delivery", "none", env=env)
    assert r.returncode == 0, r.stderr
    assert "now: pull" in r.stderr
    assert _delivery(server, "crew", "researcher") == {}
    listed = run("member", "list", "crew", env=env).stdout.splitlines()
    assert "researcher\tclaude-code\tpull" in listed

    # a member sees its team, never another member's delivery setting
    as_user = run("member", "list", "crew", "--json", env={**env, "BACKCHANNEL_TOKEN": user})
    assert as_user.returncode == 0, as_user.stderr
    assert all(m.get("delivery") is None for m in json.loads(as_user.stdout))


def test_secrets_in_a_delivery_setting_are_never_shown(server: Server) -> None:
    env = _admin(server)
    run("team", "create", "crew", env=env)
    setting = {
        "type": "stdin",
        "command": ["claude", "-p"],
        "env": {"ANTHROPIC_API_KEY": "sk-ant-very-secret", "CLAUDE_CONFIG_DIR": "/srv/claude"},
        "headers": {"X-Custom": "hdr-secret-value"},
        "secret": "sign-secret-value",
        "auth_token": "tok-secret-value",
    }
    r = run("member", "add", "crew", "lead", "--delivery", json.dumps(setting), env=env)
    assert r.returncode == 0, r.stderr
    r = run("member", "set", "crew", "lead", "--delivery", json.dumps(setting), env=env)
    assert r.returncode == 0, r.stderr
    outputs = [
        r.stderr,
        _show(server, "crew", "lead").stdout,
        _show(server, "crew", "lead", "--json").stdout,
        run("member", "list", "crew", env=env).stdout,
        run("member", "list", "crew", "--json", env=env).stdout,
    ]
    for text in outputs:
        for secret in ("sk-ant-very-secret", "hdr-secret-value", "sign-secret-value", "tok-"):
            assert secret not in text
    shown = _delivery(server, "crew", "lead")
    assert shown == {
        "type": "stdin",
        "command": ["claude", "-p"],  # where it goes stays readable
        "env": {"ANTHROPIC_API_KEY": "***", "CLAUDE_CONFIG_DIR": "/srv/claude"},
        "headers": {"X-Custom": "***"},
        "secret": "***",
        "auth_token": "***",
    }


def test_each_wrong_delivery_is_named_with_the_way_out(server: Server, tmp_path: Path) -> None:
    env = _admin(server)
    run("team", "create", "crew", env=env)
    run("member", "add", "crew", "agent", env=env)

    def set_(value: str, *, name: str = "agent", input: str | None = None) -> Any:
        return run("member", "set", "crew", name, "--delivery", value, env=env, input=input)

    # not JSON: where, with a caret under the spot (the CLI says so; nothing is sent)
    bad = set_('{"type": "tmux", target: "w:0"}')
    assert bad.returncode == 2
    assert "--delivery" in bad.stderr and "not JSON" in bad.stderr
    assert "line 1 column 18" in bad.stderr
    assert '{"type": "tmux", target: "w:0"}\n' + " " * 19 + "^" in bad.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "type": "tmux",\n  "target": "w:0",\n}\n')
    bad = set_(f"@{broken}")
    assert bad.returncode == 2
    assert f"{broken} is not JSON" in bad.stderr and "line 4 column 1" in bad.stderr
    bad = set_("-", input="tmux")
    assert bad.returncode == 2 and "stdin is not JSON" in bad.stderr
    # an error past the last line, nesting too deep, a number too long: named, no traceback
    for value, said in [
        ("{\n", "line 2 column 1"),
        ("[" * 100_000, "nested too deep"),
        ('{"turn_wait": ' + "9" * 5000 + "}", "a number with too many digits"),
    ]:
        bad = set_(value)
        assert (bad.returncode, "Traceback" in bad.stderr) == (2, False), bad.stderr
        assert said in bad.stderr, bad.stderr
    # JSON, but no object
    bad = set_('["tmux"]')
    assert bad.returncode == 2 and "not an object" in bad.stderr and "or none" in bad.stderr
    # a file that is not there
    bad = set_(f"@{tmp_path / 'nope.json'}")
    assert bad.returncode == 2
    assert "cannot read" in bad.stderr and "No such file" in bad.stderr

    # the hub's checks: an unknown adapter lists the known ones
    bad = set_('{"type": "tmuxx", "target": "w:0"}')
    assert bad.returncode == 1
    assert "unknown delivery type 'tmuxx'" in bad.stderr
    for known in ("inbox-file", "pull", "stdin", "tmux", "webhook"):
        assert known in bad.stderr
    bad = run("member", "add", "crew", "other", "--delivery", '{"type": "nope"}', env=env)
    assert bad.returncode == 1 and "unknown delivery type 'nope'" in bad.stderr
    assert "other" not in run("member", "list", "crew", env=env).stdout  # not added
    # a missing option, a URL where a registered service belongs
    bad = set_('{"type": "tmux"}')
    assert bad.returncode == 1 and "a tmux delivery needs 'target'" in bad.stderr
    bad = set_('{"type": "webhook", "service": "x", "url": "http://evil.example"}')
    assert bad.returncode == 1 and "never a URL" in bad.stderr
    # nothing wrong was stored
    assert _delivery(server, "crew", "agent") == {}
    # a member that is not there
    bad = set_("none", name="ghost")
    assert bad.returncode == 1 and "unknown member 'ghost'" in bad.stderr
    bad = _show(server, "crew", "ghost")
    assert bad.returncode == 1
    assert "no member 'ghost' in team 'crew'" in bad.stderr and "agent" in bad.stderr
    # --delivery is required by set
    bad = run("member", "set", "crew", "agent", env=env)
    assert bad.returncode == 2 and "--delivery" in bad.stderr


def test_a_webhook_naming_an_unregistered_service_is_refused_when_set(server: Server) -> None:
    """A webhook delivery naming a service the hub has not registered is refused by
    ``member set`` and ``member add`` (and so ``PATCH`` and ``POST`` of members), naming
    the registered services and how to register one, instead of being stored and every
    message to the member dead-lettered at delivery."""
    env = _admin(server)
    run("team", "create", "crew", env=env)
    run("member", "add", "crew", "agent", env=env)
    hook = '{"type": "webhook", "service": "biling"}'
    bad = run("member", "set", "crew", "agent", "--delivery", hook, env=env)
    assert bad.returncode == 1, bad.stderr
    said = " ".join(bad.stderr.split())
    assert "service 'biling', which this hub has not registered" in said, said
    assert "did you mean 'billing'?" in said and "billing, ops" in said, said
    assert "BACKCHANNEL_CALLBACKS" in said, said  # how to register one
    assert _delivery(server, "crew", "agent") == {}  # nothing stored
    bad = run("member", "add", "crew", "other", "--delivery", hook, env=env)
    assert bad.returncode == 1 and "has not registered" in bad.stderr, bad.stderr
    assert "other" not in run("member", "list", "crew", env=env).stdout
    good = '{"type": "webhook", "service": "billing"}'
    r = run("member", "set", "crew", "agent", "--delivery", good, env=env)
    assert r.returncode == 0, r.stderr


def test_a_tmux_pane_the_hub_cannot_find_is_refused_when_set(server: Server) -> None:
    """The hub sees the tmux server the setting names (its host, its socket): a target
    that is not a pane of it is refused by ``member set`` and ``member add``, naming the
    pane and how to list the panes, instead of being stored and every message to the
    member dead-lettered at delivery. A pane it has is accepted."""
    env = _admin(server)
    run("team", "create", "crew", env=env)
    run("member", "add", "crew", "agent", env=env)
    with tmux_server() as tmux:
        tmux.new_session(session_name="work", window_command="sleep 600")
        socket = tmux.cmd("display-message", "-p", "#{socket_path}").stdout[0]
        for target in ("work:5.0", "work:0.7", "nowhere:0.0"):
            setting = {"type": "tmux", "target": target, "socket_path": socket}
            bad = run("member", "set", "crew", "agent", "--delivery", json.dumps(setting), env=env)
            assert bad.returncode == 1, (target, bad.stderr)
            said = " ".join(bad.stderr.split())
            assert f"tmux pane {target!r} does not exist" in said, said
            assert f"tmux -S {socket} list-panes -a" in said, said  # how to list the panes
        assert _delivery(server, "crew", "agent") == {}  # nothing stored
        setting = {"type": "tmux", "target": "nowhere:0.0", "socket_path": socket}
        bad = run("member", "add", "crew", "other", "--delivery", json.dumps(setting), env=env)
        assert bad.returncode == 1 and "does not exist" in bad.stderr, bad.stderr
        assert "other" not in run("member", "list", "crew", env=env).stdout
        for target in ("work:0.0", "work"):
            setting = {"type": "tmux", "target": target, "socket_path": socket}
            r = run("member", "set", "crew", "agent", "--delivery", json.dumps(setting), env=env)
            assert r.returncode == 0, (target, r.stderr)


def test_a_tmux_pane_the_hub_cannot_check_is_accepted_with_a_warning(tmp_path: Path) -> None:
    """Where the hub cannot tell (tmux not installed on its host: the pane may be on
    another), the setting is accepted, and the hub's log says it could not be checked."""
    bare = tmp_path / "no-tmux-bin"
    bare.mkdir()
    server = start_server(tmp_path / "home", env={"PATH": str(bare)})
    try:
        env = _admin(server)
        run("team", "create", "crew", env=env)
        setting = '{"type": "tmux", "target": "work:0.1"}'
        r = run("member", "add", "crew", "agent", "--delivery", setting, env=env)
        assert r.returncode == 0, r.stderr
        log = (server.home / "serve.log").read_text()
        assert "could not check tmux pane 'work:0.1'" in log, log
        assert "tmux is not installed" in log, log
    finally:
        server.stop()


def test_a_tmux_target_that_is_not_there_is_dead_lettered_with_the_reason(
    server: Server,
) -> None:
    """The hub accepts a pane it cannot see yet (it may be started later); the first
    message to it is dead-lettered at once naming the pane and the fix, and the sender
    hears it."""
    env = _admin(server)
    user = run("team", "create", "crew", env=env).stdout.strip()
    socket = f"bc-test-{uuid.uuid4().hex[:8]}"  # a tmux server that is not running
    setting = {"type": "tmux", "target": "nowhere:0.0", "socket_name": socket}
    r = run("member", "add", "crew", "agent", "--delivery", json.dumps(setting), env=env)
    assert r.returncode == 0, r.stderr
    as_user = {**env, "BACKCHANNEL_TOKEN": user}
    mid = run("send", "agent", "hello", env=as_user).stdout.strip()

    def dead() -> dict[str, Any] | None:
        got = json.loads(run("status", mid, "--json", env=as_user).stdout)
        return got if got["status"] == "dead" else None

    report = eventually_blocking(dead, what="the message to be dead-lettered", within=30)
    reason = report["deliveries"][0]["dead_reason"]
    assert "'nowhere:0.0'" in reason and "change the member's delivery target" in reason
    told = run("inbox", "--json", env=as_user)
    assert "nowhere:0.0" in told.stdout  # the sender is told
    # the way out named there: point the member elsewhere (here: back to pulling)
    assert run("member", "set", "crew", "agent", "--delivery", "none", env=env).returncode == 0
    assert _delivery(server, "crew", "agent") == {}


@dataclass
class Receiver:
    url: str = ""
    secret: str = "whsec-test-signing"
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(body) for _, body in self.got]


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with rec.lock:
                rec.got.append(({"path": self.path, **dict(self.headers.items())}, body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    rec.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def test_a_webhook_set_from_the_cli_delivers_to_a_real_receiver(tmp_path: Path) -> None:
    with webhook_receiver() as rec:
        env = {
            "BACKCHANNEL_CALLBACKS": f"sink={rec.url}",
            "BACKCHANNEL_CALLBACK_SECRET": rec.secret,
        }
        server = start_server(tmp_path / "home", env=env)
        try:
            admin = _admin(server)
            user = run("team", "create", "crew", env=admin).stdout.strip()
            assert run("member", "add", "crew", "bot", env=admin).returncode == 0
            hook = '{"type": "webhook", "service": "sink"}'
            r = run("member", "set", "crew", "bot", "--delivery", hook, env=admin)
            assert r.returncode == 0, r.stderr
            listed = run("member", "list", "crew", env=admin).stdout.splitlines()
            assert 'bot\tllm\t{"type": "webhook", "service": "sink"}' in listed
            as_user = {**admin, "BACKCHANNEL_TOKEN": user}
            sent = run("send", "bot", "invoice 42 is paid", env=as_user)
            assert sent.returncode == 0, sent.stderr
            mid = sent.stdout.strip()

            def arrived() -> list[dict[str, Any]] | None:
                return rec.bodies() or None

            got = eventually_blocking(arrived, what="the webhook POST", within=30)
            assert [(b["message_id"], b["to"], b["text"]) for b in got] == [
                (mid, "bot", "invoice 42 is paid")
            ]
            headers, body = rec.got[0]
            assert headers["path"] == "/backchannel/deliver"
            t, v1 = (p.split("=", 1)[1] for p in headers["X-Backchannel-Signature"].split(","))
            want = hmac.new(rec.secret.encode(), f"{t}.".encode() + body, hashlib.sha256)
            assert hmac.compare_digest(v1, want.hexdigest())

            def acked() -> bool:
                got = json.loads(run("status", mid, "--json", env=as_user).stdout)
                return got["deliveries"][0]["state"] == "acked"

            eventually_blocking(acked, what="the pushed copy to be acked", within=30)
            shown = _show(server, "crew", "bot").stdout
            assert "push\tup" in shown
        finally:
            server.stop()


def test_a_push_target_down_is_shown_and_a_new_setting_ends_it(tmp_path: Path) -> None:
    """A webhook whose service refuses connections opens the member's push circuit:
    ``member show`` and ``member list`` say so (in their own tab-separated column), and
    setting another delivery ends it."""
    with webhook_receiver() as rec:
        dead_port = free_port()  # nothing listens there
        env = {"BACKCHANNEL_CALLBACKS": f"down=http://127.0.0.1:{dead_port},up={rec.url}"}
        server = start_server(tmp_path / "home", env=env)
        try:
            admin = _admin(server)
            user = run("team", "create", "crew", env=admin).stdout.strip()
            down = '{"type": "webhook", "service": "down"}'
            assert (
                run("member", "add", "crew", "bot", "--delivery", down, env=admin).returncode == 0
            )
            as_user = {**admin, "BACKCHANNEL_TOKEN": user}
            assert run("send", "bot", "are you there", env=as_user).returncode == 0

            def shown_down() -> str | None:
                out = _show(server, "crew", "bot").stdout
                return out if "push\tdown since" in out else None

            out = eventually_blocking(shown_down, what="the push circuit to open", within=60)
            assert "webhook" in out and "next try at" in out
            row = next(
                line.split("\t")
                for line in run("member", "list", "crew", env=admin).stdout.splitlines()
                if line.startswith("bot\t")
            )
            assert row[:3] == ["bot", "llm", down]
            assert row[3].startswith("push down since ")
            # the way out: point it at a target that answers; the circuit is about the old one
            up = '{"type": "webhook", "service": "up"}'
            assert run("member", "set", "crew", "bot", "--delivery", up, env=admin).returncode == 0
            assert "push\tup" in _show(server, "crew", "bot").stdout
        finally:
            server.stop()


def test_an_option_of_the_wrong_type_is_refused_when_set(server: Server) -> None:
    """A setting whose option has the wrong type is refused by the hub when it is set,
    naming the option, instead of being stored and dead-lettering every message."""
    env = _admin(server)
    run("team", "create", "crew", env=env)
    run("member", "add", "crew", "agent", env=env)
    cases = {
        '{"type": "tmux", "target": 5}': "'target' must be a string, got 5",
        '{"type": "tmux", "target": "w:0", "turn_wait": "3"}': "'turn_wait' must be a "
        "non-negative number, got '3'",
        '{"type": "tmux", "target": "w:0", "session": true}': "'session' must be a string",
        '{"type": "inbox-file", "root": ["/tmp"]}': "'root' must be a string",
        '{"type": "webhook", "service": {"name": "x"}}': "'service' must be a string",
        '{"type": "stdin", "command": ["claude", 5]}': "'command' must be",
        '{"type": "stdin", "command": "claude", "env": {"A": 1}}': "'env' must be",
    }
    for value, said in cases.items():
        bad = run("member", "set", "crew", "agent", "--delivery", value, env=env)
        assert bad.returncode == 1, (value, bad.stderr)
        assert said in bad.stderr, (value, bad.stderr)
        assert "delivery" in bad.stderr
    assert _delivery(server, "crew", "agent") == {}


def test_a_local_store_checks_a_delivery_setting_as_serve_does(tmp_path: Path) -> None:
    """With no ``serve`` (the CLI opens the store itself), a setting is checked just the
    same: a ``serve`` started later on that store would dead-letter every message."""
    env = {"BACKCHANNEL_HOME": str(tmp_path / "home")}
    assert run("init", env=env).returncode == 0
    assert run("team", "create", "crew", env=env).returncode == 0
    bad = run("member", "add", "crew", "agent", "--delivery", '{"type": "nope"}', env=env)
    assert bad.returncode == 1, bad.stderr
    assert "unknown delivery type 'nope'" in bad.stderr and "tmux" in bad.stderr
    assert run("member", "add", "crew", "agent", env=env).returncode == 0
    bad = run("member", "set", "crew", "agent", "--delivery", '{"type": "tmux"}', env=env)
    assert bad.returncode == 1 and "a tmux delivery needs 'target'" in bad.stderr
    good = '{"type": "tmux", "target": "work:0.1"}'
    assert run("member", "set", "crew", "agent", "--delivery", good, env=env).returncode == 0
    assert json.loads(run("member", "show", "crew", "agent", "--json", env=env).stdout)[
        "delivery"
    ] == json.loads(good)
