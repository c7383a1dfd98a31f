"""A hub member that answers A2A tasks (run it with the member's token).

Each A2A task reaches the member in its own session ``a2a-<task id>``; the closing text
of the turn (``agent_stop``) is the task's answer.

    python examples/a2a/member.py http://127.0.0.1:8765 WORKER_TOKEN worker

It rides out a hub restart (the SDK tries a call again for a few seconds); a hub that
stays away ends it with one line on stderr and exit status 1, as a refused token does.
Ctrl-C ends it quietly (status 130).
"""

from __future__ import annotations

import asyncio
import sys

from backchannel import BackchannelError, Client, PeerError


async def main(url: str, token: str, me: str) -> None:
    async with Client(url, token) as hub:
        while True:
            for s in await hub.list_sessions(me):
                sid = s.session_id
                if s.state != "idle" or not sid.startswith("a2a-"):
                    continue
                for m in await hub.receive(session=sid, pinned_only=True):
                    await hub.turn_start(sid, m.text)
                    await hub.agent_stop(sid, f"{me} read {len(m.text.split())} words: {m.text}")
                    await m.ack()
            await asyncio.sleep(0.2)


if __name__ == "__main__":
    try:
        asyncio.run(main(*sys.argv[1:4]))
    except KeyboardInterrupt:
        sys.exit(130)
    except PeerError as exc:
        sys.exit(f"member.py: stopped, the hub went away: {exc.message}")
    except BackchannelError as exc:
        sys.exit(f"member.py: {exc.message}")
