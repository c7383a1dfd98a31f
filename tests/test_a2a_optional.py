"""The core works without a2a-sdk: no /a2a routes, and delegation to an a2a service says
what to install."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["a2a"] = None  # as if a2a-sdk were not installed
from backchannel.hub import Hub
from backchannel.interfaces.a2a import available
from backchannel.interfaces.http import create_app
from backchannel.testing import MemoryStore
assert not available()
app = create_app(Hub(MemoryStore()), "admin-token")
paths = {getattr(r, "path", "") for r in app.routes}
assert not any(p.startswith("/a2a") for p in paths), paths
print("ok")
"""


def test_the_hub_serves_without_a2a_sdk() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
