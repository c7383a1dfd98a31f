"""Team files: validated with errors that point at the line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backchannel.errors import InvalidRequest
from backchannel.runner.teamfile import load_team, parse_team

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_team_file_is_valid() -> None:
    team = load_team(ROOT / "examples" / "survey-team.yaml")
    assert team.team == "survey"
    assert team.lead_name == "lead"
    assert [m.name for m in team.members] == ["lead", "counter", "finder", "reviewer"]
    assert team.settings() == {"anchor_policy": "enforce", "link_budget": 2}


def _error(text: str) -> str:
    with pytest.raises(InvalidRequest) as exc:
        parse_team(text, "team.yaml")
    return exc.value.message


def test_unknown_tool_points_at_the_line() -> None:
    msg = _error(
        "team: t\nmembers:\n  - name: a\n    policy: echo\n    tools: [send_message, teleport]\n"
    )
    assert msg.splitlines()[1].startswith("team.yaml:5: members[0].tools: unknown tool 'teleport'")


def test_several_errors_each_with_its_line() -> None:
    msg = _error(
        "team: bad name\nmembers:\n  - name: a\n    model: scripted\n  - name: b\n    model: gpt\n"
    )
    lines = msg.splitlines()[1:]
    assert lines[0].startswith("team.yaml:1: team: use 1 to 64 letters")
    assert any(
        line.startswith("team.yaml:3: members[0]: a scripted member needs a policy")
        for line in lines
    )
    assert any(
        line.startswith(
            "team.yaml:6: members[1].model: Input should be 'scripted', 'anthropic' or 'openai'"
        )
        for line in lines
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("team: t\nmembers: [\n", "team.yaml:3: not valid YAML"),
        ("- just a list\n", "team.yaml:1: a team file is a mapping"),
        ("team: t\nmembers: []\n", "team.yaml:2: members: List should have at least 1 item"),
        (
            "team: t\nmembers:\n  - {name: a, policy: echo}\n  - {name: a, policy: echo}\n",
            "member names must be unique; repeated: a",
        ),
        (
            "team: t\nlead: zed\nmembers:\n  - {name: a, policy: echo}\n",
            "lead 'zed' is not a member",
        ),
        ("team: t\nmembers:\n  - {name: a, kind: human}\n", "no llm member"),
        (
            "team: t\nmembers:\n  - {name: user, policy: echo}\n",
            "team.yaml:3: members[0].name: use 1 to 64",
        ),
        ("team: t\nmembers:\n  - {name: a, model: anthropic}\n", "needs model_name"),
        (
            "team: t\ncolour: blue\nmembers:\n  - {name: a, policy: echo}\n",
            "team.yaml:2: colour: Extra inputs are not permitted",
        ),
        (
            "team: t\nmembers:\n  - name: a\n    policy: echo\n    budget_usd: -1\n",
            "team.yaml:5: members[0].budget_usd",
        ),
    ],
)
def test_validation_errors(text: str, needle: str) -> None:
    assert needle in _error(text)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="cannot read team file"):
        load_team(tmp_path / "nope.yaml")


def test_a_file_not_in_utf8_is_named_not_a_traceback(tmp_path: Path) -> None:
    latin1 = tmp_path / "team.yaml"
    latin1.write_bytes("team: caf\xe9\nmembers:\n  - {name: a, policy: echo}\n".encode("latin-1"))
    with pytest.raises(InvalidRequest, match="byte 9 is not UTF-8; save it as UTF-8"):
        load_team(latin1)


def test_the_exit_grace_is_a_team_policy() -> None:
    text = (
        "team: t\npolicies:\n  exit_grace_seconds: 120\nmembers:\n  - name: a\n    policy: echo\n"
    )
    assert parse_team(text, "team.yaml").settings()["exit_grace_seconds"] == 120
    msg = _error(text.replace("120", "-5"))
    assert "team.yaml:3: policies.exit_grace_seconds" in msg


# docs/team-files.md's own policy, as a newcomer saves it beside the team file
MYPOLICIES = """\
from backchannel.runner.scripted import ScriptContext, call, say, use

def greeter(ctx: ScriptContext):
    if ctx.step == 0:
        return use(call("send_message", to="lead", message="hello from the greeter"))
    return say("greeted")   # the closing text
"""

GREETER_TEAM = """\
team: greet
lead: greeter
members:
  - name: greeter
    model: scripted
    policy: mypolicies:greeter
  - name: lead
    policy: echo
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed ``backchannel`` command (not ``python -m``, which would put the
    current directory on the import path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    return subprocess.run(
        [str(Path(sys.executable).parent / "backchannel"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("where", ["beside the team file", "in the current directory"])
def test_a_policy_module_of_ones_own_is_found_by_the_command(tmp_path: Path, where: str) -> None:
    """The installed command's import path holds its own bin directory, not the one it
    runs in: ``policy: mypolicies:greeter`` was a traceback (``No module named
    'mypolicies'``) after the team was already set up on the hub."""
    work, files = tmp_path / "work", tmp_path / "teams"
    work.mkdir()
    files.mkdir()
    (files / "team.yaml").write_text(GREETER_TEAM)
    (files if where == "beside the team file" else work).joinpath("mypolicies.py").write_text(
        MYPOLICIES
    )
    assert _cli("init", cwd=work).returncode == 0
    ran = _cli("run", str(files / "team.yaml"), "say hello", "--quiet", "0.5", cwd=work)
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    assert "hello from the greeter" in ran.stderr + ran.stdout


def test_a_policy_that_cannot_be_loaded_is_a_team_file_error_before_the_hub(
    tmp_path: Path,
) -> None:
    """Every policy is loaded when the file is read, so a wrong one is named with its
    line like any other mistake in the file, and the run sets nothing up on the hub
    (its team name stays free for the corrected file)."""
    (tmp_path / "team.yaml").write_text(
        "team: t\nmembers:\n  - name: a\n    policy: ech\n"
        "  - name: b\n    policy: nosuchmodule:greeter\n"
    )
    with pytest.raises(InvalidRequest) as exc:
        load_team(tmp_path / "team.yaml")
    lines = exc.value.message.splitlines()
    assert lines[0] == "invalid team file:"
    assert lines[1].startswith(f"{tmp_path / 'team.yaml'}:4: members[0].policy: ")
    assert "unknown scripted policy 'ech'" in lines[1]
    assert lines[2].startswith(f"{tmp_path / 'team.yaml'}:6: members[1].policy: ")
    assert "No module named 'nosuchmodule'" in lines[2]
    assert _cli("init", cwd=tmp_path).returncode == 0
    ran = _cli("run", "team.yaml", "task", cwd=tmp_path)
    assert ran.returncode == 1
    assert "Traceback" not in ran.stderr and "invalid team file" in ran.stderr
    assert _cli("team", "list", cwd=tmp_path).stdout.strip() == ""
