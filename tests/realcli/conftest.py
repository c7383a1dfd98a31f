"""What the real-CLI tests share: the CLIs installed once, and a hub for each module
(a module that needs its hub started otherwise defines ``server`` itself)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server, start_server

from .harness import install_clis


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return install_clis()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    name = request.module.__name__.rpartition(".")[2]
    s = start_server(tmp_path_factory.mktemp(name) / "hub")
    try:
        yield s
    finally:
        s.stop()
