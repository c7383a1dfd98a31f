"""``backchannel.tune_gc``: the collector setting a busy hub's process runs with."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

import backchannel
from backchannel.tuning import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture(autouse=True)
def thresholds_kept() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_it_raises_the_young_threshold_and_keeps_the_older_ones() -> None:
    gc.set_threshold(700, 11, 12)
    assert backchannel.tune_gc() == (700, 11, 12)
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 11, 12)
    assert tune_gc(20_000) == (GC_YOUNG_THRESHOLD, 11, 12)
    assert gc.get_threshold() == (20_000, 11, 12)


def test_a_threshold_the_program_chose_is_never_lowered_nor_collection_turned_back_on() -> None:
    gc.set_threshold(50_000, 10, 10)
    tune_gc()
    assert gc.get_threshold() == (50_000, 10, 10)
    gc.set_threshold(0, 10, 10)  # collection off
    tune_gc()
    assert gc.get_threshold() == (0, 10, 10)


@pytest.mark.parametrize("bad", [0, -5, 2**31, 10**40, True, 2.5, "10000"])
def test_a_threshold_that_is_not_a_count_is_refused_with_its_value(bad: object) -> None:
    gc.set_threshold(700, 10, 10)
    with pytest.raises(ValueError, match=f"from 1 to 2147483647, not {bad!r}"):
        tune_gc(bad)  # type: ignore[arg-type]
    assert gc.get_threshold() == (700, 10, 10)


def test_serve_tunes_its_own_process() -> None:
    code = (
        "import gc; from backchannel.interfaces.server import prepare_process; "
        "print(gc.get_threshold()[0]); prepare_process(); print(gc.get_threshold()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["700", str(GC_YOUNG_THRESHOLD)]
