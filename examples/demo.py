"""`make demo`: a hub on SQLite and a team at work on this repository, offline.

The lead of `examples/survey-team.yaml` delegates "count this repository's code by
language" and "list every TODO and FIXME" to two workers called as asynchronous tools;
a reviewer linked to the lead cross-checks the totals over a link with a budget of two
turns; an anchor timer keeps the lead on its task; the finder is deliberately slower
than its deadline, so the lead gets a timeout first and the answer later as a late
result; and the lead's closing text repeats a message it already sent, which the hub
drops. The data stays in .backchannel/demo, where the dashboard can show it again.
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

from backchannel.runner.command import print_report, run_team
from backchannel.runner.teamfile import load_team

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".backchannel" / "demo"
TASK = "Survey this repository: count its code by language and list its TODOs, then report."
console = Console(highlight=False, soft_wrap=True)


def start_hub() -> tuple[subprocess.Popen[bytes], str, str]:
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(parents=True)
    exe = Path(sys.executable).parent / "backchannel"
    with open(HOME / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [str(exe), "serve", "--port", "0"],
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


def main() -> int:
    console.print(
        "[bold]backchannel demo[/bold]: a hub on SQLite and a scripted team surveying this repository"
    )
    started = time.monotonic()
    proc, url, admin_token = start_hub()
    console.print(f"hub: {url}   dashboard: {url}/   (admin token in {HOME / 'admin.token'})")
    try:
        team = load_team(ROOT / "examples" / "survey-team.yaml")
        result = asyncio.run(
            run_team(
                team,
                TASK,
                url=url,
                admin_token=admin_token,
                workspace=ROOT,
                time_limit=120,
                quiet_seconds=1.0,
                console=console,
            )
        )
        print_report(result, console)
    finally:
        proc.terminate()
        proc.wait(10)
    late = [d for d in result.delegations if d["state"] == "late"]
    console.print(
        f"\nDone in {time.monotonic() - started:.1f} s: {len(result.delegations)} delegations "
        f"({len(late)} late), {len(result.links)} link(s), {result.duplicates_dropped} duplicate suppressed."
    )
    exe = os.path.relpath(Path(sys.executable).parent / "backchannel")
    home = os.path.relpath(HOME)
    console.print("\nOpen the dashboard on the demo's data (stop it with Ctrl-C):")
    console.print(f"  BACKCHANNEL_HOME={home} {exe} serve --port 8766", markup=False)
    console.print(
        f"then open http://127.0.0.1:8766/ and sign in with the admin token "
        f"(cat {os.path.join(home, 'admin.token')}).",
        markup=False,
    )
    return 0 if result.ended_because == "the team is quiet" else 1


if __name__ == "__main__":
    sys.exit(main())
