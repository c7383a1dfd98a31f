"""The callback registry: the only places this hub ever sends HTTP requests to.

Requests never carry URLs: they name a *service*, which the operator maps to a base URL
here. Paths are fixed by the hub and redirects are never followed, so a caller cannot
point the hub at an address of its choosing.

Configuration, later sources winning:

* ``$BACKCHANNEL_HOME/config.yaml``::

      service_name: hub-a            # how other hubs name this one in their registries
      callback_secret: "long random"  # signs and verifies reply tokens
      callbacks:
        hub-b: {url: "http://10.0.0.2:8765", token: "bc_...", teams: [leads], member: peer-b}
        shared: {url: "http://10.0.0.5:8765", teams: ["*"]}      # every team's
        weather: {type: a2a, url: "http://10.0.0.3:9999"}       # an A2A agent
        hub-c: {type: a2a, url: "http://10.0.0.4:8765/a2a/ops/{agent}", token: "bc_..."}
      retry: {start: 1, factor: 2, cap: 15, budget: 120, timeout: 10}
      delegation_retention: 604800   # seconds a finished delegation is kept (7 days)

* ``BACKCHANNEL_CALLBACKS=name=url,...``, ``BACKCHANNEL_CALLBACK_TOKENS=name=token,...``,
  ``BACKCHANNEL_CALLBACK_TEAMS=name=team+team,...``,
  ``BACKCHANNEL_CALLBACK_MEMBERS=name=member,...``, ``BACKCHANNEL_CALLBACK_SECRET``,
  ``BACKCHANNEL_SERVICE_NAME``, ``BACKCHANNEL_DELEGATION_RETENTION`` (seconds).

``token`` is this hub's credential at the service (for another hub's ``/api/chat``).
``teams`` makes the service those teams' own: only their members delegate through it
or name it as the ``callbackService`` of a task they send here (anyone else is refused
with :class:`~backchannel.errors.ServiceNotAllowed`); ``teams: ['*']``
(``BACKCHANNEL_CALLBACK_TEAMS=name=*``) makes it every team's, as the operator's
hub-wide peer. A service without ``teams`` serves a hub of one team only: once the hub
has several, no team may use it until the operator names its teams (a peer set up for
the first team would otherwise take tasks from, and send answers to, every team added
later; see docs/decisions.md, "A callback service without teams"). ``member`` names the member of this hub
the service's tasks come in as (the other hub's member of the team, when it is not named
like the service), so the pair budget counts a task out and a task in as one pair's; a
task for the service is refused while it names no agent of the caller's team, and a task
sent here that names the service as its ``callbackService`` is taken only from that
member (:meth:`CallbackConfig.resolve_reply`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from backchannel.core.delegation import RetryPolicy
from backchannel.core.messages import NAME_RE, suggest
from backchannel.errors import InvalidRequest, ServiceNotAllowed, UnknownService

CONFIG_FILE = "config.yaml"
#: How long a finished delegation (and its stored reply token) is kept, by default.
DEFAULT_RETENTION = 7 * 86_400.0
SERVICE_KINDS = ("backchannel", "a2a")
#: The ``teams`` of a service every team of the hub may use.
EVERY_TEAM = "*"


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    url: str
    token: str | None = field(default=None, repr=False)
    #: ``backchannel`` (another hub's ``/api/chat``) or ``a2a`` (an A2A agent: ``url`` is
    #: the agent, or holds ``{agent}`` for the name before the ``@``)
    kind: str = "backchannel"
    #: the teams whose members may use the service (:data:`EVERY_TEAM` among them: every
    #: team); None: the only team of a hub of one team, and none of a hub of several
    teams: frozenset[str] | None = None
    #: the member of this hub the service's tasks come in as (the other hub's member of
    #: the team); None: the member named like the service, when there is one
    member: str | None = None

    def usable_by(self, team: str, teams_in_hub: int) -> bool:
        """Whether a member of ``team``, on a hub of ``teams_in_hub`` teams, may use it."""
        if self.teams is None:
            return teams_in_hub <= 1
        return team in self.teams or EVERY_TEAM in self.teams

    def endpoint(self, path: str) -> str:
        return self.url.rstrip("/") + path

    def agent_url(self, agent: str) -> str:
        """Where the A2A agent ``agent`` of this service is (its card below it)."""
        return self.url.replace("{agent}", agent).rstrip("/")


@dataclass(frozen=True)
class CallbackConfig:
    secret: str | None = field(default=None, repr=False)
    service_name: str = "backchannel"
    services: Mapping[str, Service] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    retention: float = DEFAULT_RETENTION  # seconds a finished delegation is kept

    def resolve(
        self, name: str, *, team: str | None = None, teams_in_hub: int | None = None
    ) -> Service:
        """The registered service, or ``UnknownService`` (400) naming the known ones. With
        ``team`` (and ``teams_in_hub``, how many teams the hub has), one its members may
        use, or ``ServiceNotAllowed`` (403): a service registered for other teams is
        named only among those a member may use, and which teams those are is not told;
        one registered for no team, on a hub of several, is refused naming the setting."""
        svc = self.services.get(name)
        if team is not None and teams_in_hub is None:
            raise TypeError("resolve(team=...) needs teams_in_hub, the hub's number of teams")
        hub_teams = teams_in_hub or 0
        if svc is not None and team is not None and svc.teams is None and hub_teams > 1:
            raise ServiceNotAllowed(
                f"callback service {name!r} is registered for no team, and a service of no "
                f"team serves a hub of one team only (this hub has {hub_teams}); the operator "
                f"names the teams that may use it (teams: in the config file, or "
                f"BACKCHANNEL_CALLBACK_TEAMS={name}={team}, or ={EVERY_TEAM} for every "
                "team) and restarts the hub.",
                service=name,
            )
        if svc is not None and team is not None and not svc.usable_by(team, hub_teams):
            mine = ", ".join(
                sorted(k for k, s in self.services.items() if s.usable_by(team, hub_teams))
            )
            raise ServiceNotAllowed(
                f"callback service {name!r} is registered for other teams than {team!r}; "
                f"name one of this team's services ({mine or 'none is registered'}), or the "
                f"operator adds {team!r} to the service's teams (teams: in the config "
                f"file, or BACKCHANNEL_CALLBACK_TEAMS={name}=...+{team}).",
                service=name,
            )
        if svc is None:
            hints = suggest(name, self.services)
            tail = f"; did you mean {' or '.join(map(repr, hints))}?" if hints else "."
            known = ", ".join(sorted(self.services)) or "none are registered"
            raise UnknownService(
                f"unknown callback service {name!r}{tail} Known services: {known}. The operator "
                "registers services in BACKCHANNEL_CALLBACKS or the config file, which the hub "
                "reads when it starts (restart it after a change).",
                service=name,
            )
        return svc

    def unscoped_warning(self, teams_in_hub: int) -> str | None:
        """What to tell the operator of a hub of ``teams_in_hub`` teams at start: the
        services registered for no team, which none of its teams may use once it has
        several (:meth:`resolve`), and how to name theirs; ``None`` when there are none."""
        names = sorted(n for n, s in self.services.items() if s.teams is None)
        if teams_in_hub <= 1 or not names:
            return None
        first = names[0]
        return (
            f"callback services registered for no team: {', '.join(map(repr, names))}; this "
            f"hub has {teams_in_hub} teams, and a service of no team serves a hub of one "
            "team only, so none of its teams may use them. Name the teams of each: "
            f"BACKCHANNEL_CALLBACK_TEAMS={first}=team+team (={EVERY_TEAM} for every team), "
            "or teams: in config.yaml, and restart the hub."
        )

    def resolve_reply(self, name: str, *, team: str, teams_in_hub: int, caller: str) -> Service:
        """The service a task ``caller`` sends here (``/api/chat``) names as its
        ``callbackService``: one ``team`` may use (:meth:`resolve`) and, when its
        ``member:`` binds it to a member, one ``caller`` is, or ``ServiceNotAllowed``
        (403). Its tasks come in as that member, so another member naming it would have
        answers sent to a hub that never asked, and its task counted against its own
        pair rather than the service's."""
        svc = self.resolve(name, team=team, teams_in_hub=teams_in_hub)
        if svc.member is not None and svc.member != caller:
            raise ServiceNotAllowed(
                f"callback service {name!r} is bound to member {svc.member!r} (its member: "
                f"setting): only {svc.member!r} names it as the callbackService of a task, "
                f"and {caller!r} is not {svc.member!r}; send the task with {svc.member!r}'s "
                f"token, or name the service registered for {caller!r}, or the operator "
                "changes the service's member: (in the config file, or "
                f"BACKCHANNEL_CALLBACK_MEMBERS={name}=...) and restarts the hub.",
                service=name,
                member=svc.member,
            )
        return svc

    @classmethod
    def load(cls, home: Path | None = None, env: Mapping[str, str] | None = None) -> CallbackConfig:
        env = os.environ if env is None else env
        data: dict[str, Any] = {}
        if home is not None and (home / CONFIG_FILE).exists():
            try:
                loaded = yaml.safe_load((home / CONFIG_FILE).read_text()) or {}
            except yaml.YAMLError as exc:
                raise InvalidRequest(f"{home / CONFIG_FILE} is not valid YAML: {exc}") from exc
            if not isinstance(loaded, dict):
                raise InvalidRequest(f"{home / CONFIG_FILE} must be a mapping")
            data = loaded
        services: dict[str, Service] = {}
        for name, spec in (data.get("callbacks") or {}).items():
            if isinstance(spec, str):
                spec = {"url": spec}
            if not isinstance(spec, dict) or "url" not in spec:
                raise InvalidRequest(f"callback {name!r} in {CONFIG_FILE} needs a url")
            kind = str(spec.get("type", "backchannel"))
            if kind not in SERVICE_KINDS:
                raise InvalidRequest(
                    f"callback {name!r} in {CONFIG_FILE}: unknown type {kind!r}; use one of "
                    f"{', '.join(SERVICE_KINDS)}"
                )
            services[str(name)] = Service(
                str(name),
                _check_url(str(name), str(spec["url"])),
                spec.get("token"),
                kind,
                _teams(str(name), spec.get("teams"), f"callback {name!r} in {CONFIG_FILE}"),
                _member(str(name), spec.get("member"), f"callback {name!r} in {CONFIG_FILE}"),
            )
        tokens = _pairs(env.get("BACKCHANNEL_CALLBACK_TOKENS", ""), "BACKCHANNEL_CALLBACK_TOKENS")
        for name, url in _pairs(
            env.get("BACKCHANNEL_CALLBACKS", ""), "BACKCHANNEL_CALLBACKS"
        ).items():
            known = services.get(name, Service(name, url))
            services[name] = dataclasses.replace(known, url=_check_url(name, url))
        for name, token in tokens.items():
            if name in services:
                services[name] = dataclasses.replace(services[name], token=token)
        where = "BACKCHANNEL_CALLBACK_TEAMS"
        for name, teams in _pairs(env.get(where, ""), where).items():
            services[name] = dataclasses.replace(
                _registered(services, name, where), teams=_teams(name, teams.split("+"), where)
            )
        where = "BACKCHANNEL_CALLBACK_MEMBERS"
        for name, member in _pairs(env.get(where, ""), where).items():
            services[name] = dataclasses.replace(
                _registered(services, name, where), member=_member(name, member, where)
            )
        retry = RetryPolicy(**{k: float(v) for k, v in (data.get("retry") or {}).items()})
        return cls(
            retention=_retention(
                env.get("BACKCHANNEL_DELEGATION_RETENTION", data.get("delegation_retention"))
            ),
            secret=env.get("BACKCHANNEL_CALLBACK_SECRET") or data.get("callback_secret"),
            service_name=env.get("BACKCHANNEL_SERVICE_NAME")
            or data.get("service_name")
            or "backchannel",
            services=services,
            retry=retry,
        )


def _teams(name: str, value: Any, where: str) -> frozenset[str] | None:
    """A service's ``teams``: a list of team names, or :data:`EVERY_TEAM` (None: the
    only team of a hub of one team)."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(t, str) and (t == EVERY_TEAM or NAME_RE.fullmatch(t)) for t in value)
    ):
        raise InvalidRequest(
            f"{where}: the teams of service {name!r} must be a non-empty list of team names "
            f"(got {value!r}), or [{EVERY_TEAM!r}] for a service every team may use"
        )
    return frozenset(value)


def _member(name: str, value: Any, where: str) -> str | None:
    """A service's ``member``: the name of a member (None: the one named like the
    service, when there is one). Whether the team has it is known only when a member
    of a team uses the service (:meth:`Budgets.check_service_member`)."""
    if value is None:
        return None
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise InvalidRequest(
            f"{where}: the member of service {name!r} must be a member name (1 to 64 "
            f"letters, digits, '_' or '-', got {value!r}): the member of this hub the "
            "service's tasks come in as; leave it out when that member is named like the "
            "service"
        )
    return value


def _retention(value: Any) -> float:
    if value is None or value == "":
        return DEFAULT_RETENTION
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise InvalidRequest(
            f"delegation retention must be a positive number of seconds, got {value!r}; set "
            "BACKCHANNEL_DELEGATION_RETENTION (or delegation_retention in the config file)"
        )
    return seconds


def _registered(services: Mapping[str, Service], name: str, where: str) -> Service:
    """The service ``name`` that the environment variable ``where`` sets more of; one
    not registered is refused, naming where to register it."""
    if name not in services:
        raise InvalidRequest(
            f"{where}: {name!r} is not a registered callback service; register it "
            "in BACKCHANNEL_CALLBACKS or the config file first"
        )
    return services[name]


def _pairs(text: str, where: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidRequest(
                f"{where}: expected name=value pairs separated by commas, got {item!r}"
            )
        out[name.strip()] = value.strip()
    return out


def _check_url(name: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidRequest(f"callback {name!r}: {url!r} is not an http(s) base URL")
    return url
