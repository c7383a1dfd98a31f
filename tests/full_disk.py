"""A small filesystem of a test's own, to fill up: how a full disk (ENOSPC) fails in
the field, with real writes on a real filesystem.

:func:`small_disk` mounts a tmpfs of ``size`` under ``tmp_path``. Mounting needs root;
without it, the test runs again in a child ``pytest`` inside a user and mount
namespace of its own (``unshare -rm``), where it may mount, and the outer run takes
that child's outcome. Only where neither works is the test skipped.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_INSIDE = "BACKCHANNEL_TEST_IN_NAMESPACE"


@functools.cache
def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@functools.cache
def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        run = subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /tmp"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0


@contextlib.contextmanager
def small_disk(
    request: pytest.FixtureRequest, tmp_path: Path, size: str, *, inodes: int | None = None
) -> Iterator[Path]:
    """A tmpfs of ``size`` ("4m") and at most ``inodes`` files and directories, mounted
    at ``tmp_path / "disk"`` while the ``with`` lasts; see the module docstring for where
    mounting is refused."""
    if not _can_mount():
        if os.environ.get(_INSIDE) or not _can_unshare():
            pytest.skip("mounting a tmpfs needs root or a user namespace (unshare -rm)")
        child = subprocess.run(
            ["unshare", "-rm", sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
             "-p", "no:cacheprovider", request.node.nodeid],
            env={**os.environ, _INSIDE: "1"},
            cwd=request.config.rootpath,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )  # fmt: skip
        assert child.returncode == 0, f"in a user namespace:\n{child.stdout}\n{child.stderr}"
        pytest.skip("passed in a user and mount namespace of its own (unshare -rm)")
    mount = tmp_path / "disk"
    mount.mkdir()
    options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, name: str = "filler") -> Path:
    """Fill ``disk`` to the last byte with the file ``name``; returns it (unlink it to
    free the space again)."""
    filler = disk / name
    with open(filler, "ab", buffering=0) as f:
        for chunk in (1 << 20, 4096, 512):  # then what the larger writes left
            with contextlib.suppress(OSError):
                while f.write(b"\0" * chunk):
                    pass
    return filler


def fill_inodes(disk: Path) -> Path:
    """Use up every inode of ``disk`` with empty files in the directory ``inodes`` (a
    disk full that way fails any new file or directory); returns the directory."""
    folder = disk / "inodes"
    folder.mkdir()
    with contextlib.suppress(OSError):
        for n in range(1_000_000):
            (folder / str(n)).touch()
    return folder
