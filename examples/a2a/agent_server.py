"""A small A2A agent built with the official SDK, for hub members to delegate to.

python examples/a2a/agent_server.py 9999
"""

from __future__ import annotations

import sys

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette


class Forecaster(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id
        assert context.context_id
        assert context.message
        task = Task(id=context.task_id, context_id=context.context_id, history=[context.message])
        task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        place = context.get_user_input().split()[-1]
        await updater.add_artifact([Part(text=f"sunny in {place}")], name="forecast")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def app(port: int) -> Starlette:
    card = AgentCard(
        name="forecaster",
        description="Tells the weather",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="forecast", name="forecast", description="weather", tags=["w"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=Forecaster(), task_store=InMemoryTaskStore(), agent_card=card
    )
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9999
    uvicorn.run(app(port), host="127.0.0.1", port=port, log_level="warning")
