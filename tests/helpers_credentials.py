"""Helpers the token and removal tests over real sockets share: taking ``worker`` of team
``crew`` off its token, and what became of a message."""

from __future__ import annotations

from tests.conftest import Server


def revoke(hub: Server, how: str) -> None:
    """Take ``worker`` of team ``crew`` off its token on ``hub``, the way ``how`` names:
    "rotate" its token, "remove member", or "remove team"."""
    with hub.client() as admin:
        r = {
            "rotate": lambda: admin.post("/v1/teams/crew/members/worker/token"),
            "remove member": lambda: admin.delete("/v1/teams/crew/members/worker"),
            "remove team": lambda: admin.delete("/v1/teams/crew"),
        }[how]()
        assert r.status_code == 200, r.text


def delivery_state(hub: Server, token: str, mid: str) -> str:
    """The state of the first delivery of message ``mid``, as ``token`` is told it."""
    with hub.client(token) as c:
        return str(c.get(f"/v1/messages/{mid}").json()["deliveries"][0]["state"])
