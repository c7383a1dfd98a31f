"""Team files: one YAML file describes a team for ``backchannel run``.

::

    team: survey
    lead: lead                      # who gets the task [the first llm member]
    policies:
      anchor: enforce               # enforce | warn | off
      link_budget: 8
      link_rules: "..."             # optional, with {peer} and {budget}
      pair_budget: 24               # exchanges between two agents per pair_window
      pair_window: 3600             # seconds
      chain_budget: 32              # agent hops after a human, timer or outside task
    callbacks:                      # optional: callback services (name: url)
      hub-b: http://127.0.0.1:9001
    members:
      - name: lead
        kind: llm                   # llm members are hosted by the runner
        model: scripted             # scripted | anthropic | openai
        policy: survey-lead         # scripted only: built-in name or module:function
        model_name: claude-sonnet-5-5   # anthropic/openai: the model id
        base_url: http://localhost:11434/v1   # openai-compatible servers
        system: "You lead the team..."
        tools: [send_message, delegate, set_timer]
        link_budget: 3
        checkpoint: {idle_seconds: 300, text: "Where are you?"}
        delivery: {type: pull}
        budget_usd: 0.50            # stop this agent when spent
        max_tokens: 200000          # or when this many tokens are used
        options: {delay: 2}         # scripted only: seeds the policy's state

Errors point at the line: ``team.yaml:12: members[1].model: unknown model provider 'gpt'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from backchannel.core.messages import NAME_RE
from backchannel.errors import InvalidRequest
from backchannel.runner.scripted import Policy, load_policy
from backchannel.runner.tools import TOOLS
from backchannel.types import MemberKind


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Checkpoint(_Strict):
    idle_seconds: float = Field(gt=0)
    text: str | None = None


class MemberSpec(_Strict):
    name: str
    kind: MemberKind = MemberKind.LLM
    model: Literal["scripted", "anthropic", "openai"] = "scripted"
    policy: str | None = None
    model_name: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    system: str = ""
    tools: list[str] | None = None
    link_budget: int | None = Field(None, ge=1, le=1000)
    checkpoint: Checkpoint | None = None
    delivery: dict[str, Any] = Field(default_factory=dict)
    budget_usd: float | None = Field(None, gt=0)
    max_tokens: int | None = Field(None, gt=0)
    max_steps: int = Field(12, ge=1, le=200)
    context_chars: int = Field(400_000, ge=1_000, le=100_000_000)
    price: dict[str, float] | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    #: the scripted policy, loaded when the file was read (``load_team``)
    _loaded_policy: Policy | None = PrivateAttr(default=None)

    @property
    def loaded_policy(self) -> Policy | None:
        return self._loaded_policy

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v) or v in ("user", "hub"):
            raise ValueError("use 1 to 64 letters, digits, '_' or '-' (not 'user' or 'hub')")
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[str] | None) -> list[str] | None:
        for t in v or []:
            if t not in TOOLS:
                raise ValueError(f"unknown tool {t!r}; known tools: {', '.join(sorted(TOOLS))}")
        return v

    @model_validator(mode="after")
    def _model(self) -> MemberSpec:
        if self.kind is MemberKind.LLM:
            if self.model == "scripted" and not self.policy:
                raise ValueError(
                    "a scripted member needs a policy (a built-in name or module:function)"
                )
            if self.model in ("anthropic", "openai") and not self.model_name:
                raise ValueError(
                    f"an {self.model} member needs model_name, e.g. claude-sonnet-5-5 or gpt-4o"
                )
        return self


class Policies(_Strict):
    anchor: Literal["enforce", "warn", "off"] = "enforce"
    link_budget: int = Field(8, ge=1, le=1000)
    link_rules: str | None = None
    pair_budget: int | None = Field(None, ge=1, le=100_000)
    pair_window: float | None = Field(None, gt=0, le=30 * 24 * 3600)
    chain_budget: int | None = Field(None, ge=1, le=100_000)
    exit_grace_seconds: float | None = Field(None, ge=0, le=30 * 86400)


class TeamFile(_Strict):
    team: str
    lead: str | None = None
    policies: Policies = Field(default_factory=lambda: Policies.model_validate({}))
    callbacks: dict[str, str] = Field(default_factory=dict)
    members: list[MemberSpec] = Field(min_length=1)

    @field_validator("team")
    @classmethod
    def _team(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("use 1 to 64 letters, digits, '_' or '-'")
        return v

    @model_validator(mode="after")
    def _check(self) -> TeamFile:
        names = [m.name for m in self.members]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"member names must be unique; repeated: {', '.join(sorted(dup))}")
        if self.lead is not None and self.lead not in names:
            raise ValueError(f"lead {self.lead!r} is not a member; members: {', '.join(names)}")
        if not any(m.kind is MemberKind.LLM for m in self.members):
            raise ValueError("no llm member: the runner hosts only kind: llm members")
        return self

    @property
    def lead_name(self) -> str:
        return self.lead or next(m.name for m in self.members if m.kind is MemberKind.LLM)

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "anchor_policy": self.policies.anchor,
            "link_budget": self.policies.link_budget,
        }
        if self.policies.link_rules:
            out["link_rules"] = self.policies.link_rules
        for name in ("pair_budget", "pair_window", "chain_budget"):
            value = getattr(self.policies, name)
            if value is not None:
                out[name] = value
        if self.policies.exit_grace_seconds is not None:
            out["exit_grace_seconds"] = self.policies.exit_grace_seconds
        return out


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The line (1-based) of the YAML node at ``loc``, or of its nearest parent."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            found = next(
                (v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key),
                None,
            )
            if found is None:
                found = next(
                    (k for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.value == key),
                    None,
                )
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            found = node.value[key]
        else:
            found = None
        if found is None:
            break
        node = found
        line = node.start_mark.line + 1
    return line


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_team(
    text: str, source: str = "team.yaml", policy_dirs: Sequence[Path] | None = None
) -> TeamFile:
    """Parse and validate a team file; errors name the file, the line and the field.
    With ``policy_dirs`` each scripted member's policy is loaded too (its module
    imported from those directories first), so a policy that cannot be is named with
    its line like any other mistake, before a run sets anything up on a hub."""
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{source}:{mark.line + 1}" if mark is not None else source
        raise InvalidRequest(f"{at}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"{source}:1: a team file is a mapping with team: and members:")
    try:
        team = TeamFile.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(
                p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))
            )
            line = _line_of(node, loc)
            at = f"{source}:{line}" if line else source
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{at}: {_where(loc)}: {msg}")
        raise InvalidRequest("invalid team file:\n" + "\n".join(lines)) from None
    if policy_dirs is not None:
        _load_policies(team, node, source, policy_dirs)
    return team


def _load_policies(
    team: TeamFile, node: yaml.Node | None, source: str, dirs: Sequence[Path]
) -> None:
    lines = []
    for i, m in enumerate(team.members):
        if m.kind is not MemberKind.LLM or m.model != "scripted" or m.policy is None:
            continue
        try:
            m._loaded_policy = load_policy(m.policy, dirs)
        except ValueError as exc:
            loc: tuple[int | str, ...] = ("members", i, "policy")
            line = _line_of(node, loc)
            at = f"{source}:{line}" if line else source
            lines.append(f"{at}: {_where(loc)}: {exc}")
    if lines:
        raise InvalidRequest("invalid team file:\n" + "\n".join(lines))


def load_team(path: str | Path) -> TeamFile:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequest(f"cannot read team file {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"cannot read team file {p}: byte {exc.start} is not UTF-8; save it as UTF-8"
        ) from None
    # a policy module of the user's own: beside the team file, else where they run
    return parse_team(text, str(p), policy_dirs=[p.resolve().parent, Path.cwd()])
