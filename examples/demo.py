"""`make demo`: start a hub on SQLite, let two agents talk through it, show what happened.

Runs offline in a few seconds and exits 0. The hub's data lands in .backchannel/demo.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

import backchannel

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".backchannel" / "demo"
console = Console(highlight=False)


def start_hub() -> tuple[subprocess.Popen[bytes], str, str]:
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(parents=True)
    exe = Path(sys.executable).parent / "backchannel"
    with open(HOME / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [str(exe), "serve", "--port", "0", "--lease", "30"],
            env={**os.environ, "BACKCHANNEL_HOME": str(HOME)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the hub did not start:\n{(HOME / 'serve.log').read_text()}")
        info = HOME / "server.json"
        if info.exists():
            url = json.loads(info.read_text())["url"]
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return proc, url, (HOME / "admin.token").read_text().strip()
            except httpx.HTTPError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("the hub did not answer within 30 s")


async def conversation(url: str, admin_token: str) -> None:
    async with backchannel.connect(url, admin_token) as admin:
        await admin.create_team("demo")
        lead = (await admin.add_member("demo", "lead", "llm"))["token"]
        worker = (await admin.add_member("demo", "worker", "llm"))["token"]
    console.print(f"team [bold]demo[/bold]: lead, worker and user, on the hub at {url}")

    async with (
        backchannel.connect(url, lead) as as_lead,
        backchannel.connect(url, worker) as as_worker,
    ):
        # the worker waits first: the message is pushed to it when the send commits
        waiting = asyncio.create_task(as_worker.receive(wait=10))
        await asyncio.sleep(0.05)
        sent = await as_lead.send(
            "worker",
            "Count the Python files under src/.",
            summary="count files",
            message_id="demo-1",
        )
        replay = await as_lead.send(
            "worker",
            "Count the Python files under src/.",
            summary="count files",
            message_id="demo-1",
        )
        got = await waiting
        task = got[0]
        console.print(
            f"lead -> worker: {task.text!r}  (retry with the same id: {replay['status']})"
        )
        count = sum(1 for _ in (ROOT / "src").rglob("*.py"))
        await task.ack()
        await as_worker.send("lead", f"There are {count} Python files under src/.", summary="count")
        answer = (await as_lead.receive(wait=10))[0]
        await answer.ack()
        console.print(f"worker -> lead: {answer.text!r}")
        try:
            await as_lead.send("wrker", "hello?")
        except backchannel.UnknownRecipient as exc:
            console.print(f"lead -> 'wrker': refused, {exc.message}")
        await as_lead.send("*", "Thanks all, wrapping up.", summary="wrap-up")
        status = await as_lead.status(sent["message_id"])

    table = Table(title=f"history of {sent['message_id']}")
    for col in ("event", "to", "detail"):
        table.add_column(col)
    for h in status["history"]:
        table.add_row(h["event"], h["to"], h["detail"])
    console.print(table)


def main() -> int:
    console.print("[bold]backchannel demo[/bold]: a hub on SQLite, two agents, one conversation")
    proc, url, admin_token = start_hub()
    try:
        asyncio.run(conversation(url, admin_token))
        console.print(f"\ndashboard: {url}/  (the hub stops when the demo ends)")
        console.print(f"data: {HOME}")
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
