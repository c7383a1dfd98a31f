"""A hub member that answers A2A tasks (run it with the member's token).

Each A2A task reaches the member in its own session ``a2a-<task id>``; the closing text
of the turn (``agent_stop``) is the task's answer.

    python examples/a2a/member.py http://127.0.0.1:8765 WORKER_TOKEN worker
"""

from __future__ import annotations

import asyncio
import sys

from backchannel import Client


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
    asyncio.run(main(*sys.argv[1:4]))
