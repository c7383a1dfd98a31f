"""Call a hub member with the official A2A client (a2a-sdk).

python examples/a2a/call.py http://127.0.0.1:8765/a2a/demo/worker USER_TOKEN "hello there"
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
from a2a.utils.errors import A2AError


async def main(agent_url: str, token: str, text: str) -> None:
    auth = {"Authorization": f"Bearer {token}"}  # a member of the same team
    async with httpx.AsyncClient(headers=auth, timeout=60) as http:
        client = await create_client(agent_url, ClientConfig(httpx_client=http))
        message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=text)])
        async for event in client.send_message(SendMessageRequest(message=message)):
            if event.HasField("status_update"):
                print("status:", TaskState.Name(event.status_update.status.state))
            elif event.HasField("artifact_update"):
                print("answer:", event.artifact_update.artifact.parts[0].text)
        await client.close()


if __name__ == "__main__":
    try:
        asyncio.run(main(*sys.argv[1:4]))
    except KeyboardInterrupt:
        sys.exit(130)
    except (A2AError, httpx.HTTPError) as exc:  # no hub there, a refused token, ...
        sys.exit(f"call.py: {exc}")
