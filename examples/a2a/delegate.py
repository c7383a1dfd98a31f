"""A hub member delegates to the A2A agent registered as service ``weather``.

python examples/a2a/delegate.py http://127.0.0.1:8765 LEAD_TOKEN
"""

from __future__ import annotations

import asyncio
import sys

from backchannel import BackchannelError, Client


async def main(url: str, token: str) -> None:
    async with Client(url, token) as hub:
        await hub.open_session("lead-main")
        await hub.turn_start("lead-main", "plan the trip")
        await hub.delegate("forecaster@weather", "forecast for Oslo", session="lead-main")
        await hub.agent_stop("lead-main", "")  # the turn ends; the answer comes between turns
        while True:
            for m in await hub.receive(session="lead-main", wait=10):
                await m.ack()
                if m.kind == "tool_result":
                    print(m.text)
                    return


if __name__ == "__main__":
    try:
        asyncio.run(main(*sys.argv[1:3]))
    except KeyboardInterrupt:
        sys.exit(130)
    except BackchannelError as exc:
        sys.exit(f"delegate.py: {exc.message}")
