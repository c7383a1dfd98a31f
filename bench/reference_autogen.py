"""autogen-core's in-memory runtime under the load ``bench_send inproc`` puts on the hub.

Run by :mod:`bench.bench_reference` with an interpreter of its own (autogen-core pins a
protobuf older than the one the hub's A2A extra needs, so the two cannot share one
environment); it imports nothing of backchannel. ``--senders`` senders each send
``--messages / --senders`` messages one at a time: ``send_message`` returns once the
receiver's handler has run, which is autogen-core's send → received → handled, the
counterpart of the hub's send → received → acked (without durability: nothing is
written anywhere). Each sender has a receiver agent of its own, texts are ``--size``
bytes, and the event loop is uvloop when installed, as in the hub's benchmark. Prints one
JSON line: messages, seconds, msgs/s and the process's CPU per message.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from autogen_core import (
    AgentId,
    MessageContext,
    RoutedAgent,
    SingleThreadedAgentRuntime,
    message_handler,
)


@dataclass
class Text:
    text: str


class Receiver(RoutedAgent):
    def __init__(self) -> None:
        super().__init__("a benchmark receiver")
        self.received = 0

    @message_handler
    async def on_text(self, message: Text, ctx: MessageContext) -> None:
        self.received += 1


async def measure(
    senders: int, messages: int, size: int, warmup: int, batch: int = 1
) -> dict[str, Any]:
    runtime = SingleThreadedAgentRuntime()
    await Receiver.register(runtime, "receiver", Receiver)
    runtime.start()
    text = "x" * size
    each = max(batch, messages // senders // batch * batch)

    async def sender(i: int, count: int) -> None:
        to = AgentId("receiver", f"r{i}")
        if batch == 1:
            for _ in range(count):
                await runtime.send_message(Text(text), to)
            return
        # autogen-core has no call that sends many: ``batch`` sends at once, each
        # awaited, the next ``batch`` once all of them were handled
        for _ in range(max(1, count // batch)):
            await asyncio.gather(*(runtime.send_message(Text(text), to) for _ in range(batch)))

    await asyncio.gather(*(sender(i, max(1, warmup // senders)) for i in range(senders)))
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(sender(i, each) for i in range(senders)))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    await runtime.stop()
    total = each * senders
    return {
        "messages": total,
        "seconds": seconds,
        "msgs_s": total / seconds,
        "cpu_us_per_message": cpu / total * 1e6,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--senders", type=int, default=16)
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--size", type=int, default=256, help="text size in bytes")
    p.add_argument("--warmup", type=int, default=500, help="messages sent first, not counted")
    p.add_argument("--gc-young", type=int, default=0, help="gc threshold 0 (0: Python's own)")
    p.add_argument(
        "--batch", type=int, default=1, help="sends a sender makes at once (1: one at a time)"
    )
    args = p.parse_args()
    if args.gc_young > 0:
        gc.set_threshold(args.gc_young, *gc.get_threshold()[1:])
    loop = "asyncio"
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
        loop = "uvloop"
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        got = runner.run(
            measure(args.senders, args.messages, args.size, args.warmup, max(1, args.batch))
        )
    got.update(batch=max(1, args.batch), loop=loop, autogen_core=metadata.version("autogen-core"),
               python=sys.version.split()[0], gc=list(gc.get_threshold()))  # fmt: skip
    print(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.exit(main())
