"""Fixtures for the delivery tests: Node.js with the real ``proper-lockfile`` package."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NPM_CACHE = REPO / ".cache" / "npm-test"


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """``node_modules`` holding ``proper-lockfile@4``, installed once into ``.cache/npm-test``.

    Fails (never skips) when ``node`` or ``npm`` is missing: the contention test is the
    proof that our writer and Claude Code's interleave safely.
    """
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "the Claude Code inbox tests need Node.js and npm on PATH "
            "(e.g. `apt-get install nodejs npm`); they run the real proper-lockfile package",
            pytrace=False,
        )
    modules = NPM_CACHE / "node_modules"
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    ignore = REPO / ".cache" / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    # the suite's workers share the cache: one installs while the others wait for it
    with open(NPM_CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _install(npm, modules)
    return modules


def _install(npm: str, modules: Path) -> None:
    if not (modules / "proper-lockfile" / "package.json").is_file():
        done = subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(NPM_CACHE),
                "proper-lockfile@4",
            ],
            capture_output=True,
            text=True,
            timeout=110,
        )
        if done.returncode != 0 or not (modules / "proper-lockfile").is_dir():
            pytest.fail(
                f"`npm install proper-lockfile@4` into {NPM_CACHE} failed "
                f"(exit {done.returncode}):\n{done.stdout}\n{done.stderr}",
                pytrace=False,
            )
