"""``backchannel.tune_gc`` and ``pin_to_cpu``: the settings a busy hub's process runs
with."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import backchannel
from backchannel.tuning import GC_YOUNG_THRESHOLD, pin_to_cpu, tune_gc, unpin_cpu


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


# -- pin_to_cpu: one CPU for a hub's process -------------------------------------------------

needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's"
)


def _allowed_of_every_thread(pid: int | str = "self") -> set[str]:
    """Each thread's ``Cpus_allowed_list``, as the kernel reports it."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.add(line.split(":", 1)[1].strip())
    return out


@needs_affinity
def test_every_thread_is_pinned_those_running_and_those_started_later_then_let_go() -> None:
    code = textwrap.dedent(
        """
        import os, threading, json, pathlib
        from backchannel import pin_to_cpu, unpin_cpu
        def allowed():
            out = set()
            for t in pathlib.Path("/proc/self/task").iterdir():
                for line in (t / "status").read_text().splitlines():
                    if line.startswith("Cpus_allowed_list:"):
                        out.add(line.split(":", 1)[1].strip())
            return sorted(out)
        stop = threading.Event()
        early = threading.Thread(target=stop.wait); early.start()
        cpu = max(os.sched_getaffinity(0))
        before = pin_to_cpu(cpu)
        late = threading.Thread(target=stop.wait); late.start()
        pinned = allowed()
        unpin_cpu(before)
        after = allowed()
        stop.set(); early.join(); late.join()
        print(json.dumps({"cpu": cpu, "before": sorted(before), "pinned": pinned,
                          "after": after, "threads": 3}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(done.stdout)
    assert got["pinned"] == [str(got["cpu"])]  # the main thread, the early and the late one
    assert set(got["before"]) == os.sched_getaffinity(0)
    mine = next(ln for ln in Path("/proc/self/status").read_text().splitlines()
            if ln.startswith("Cpus_allowed_list:")).split(":", 1)[1].strip()  # fmt: skip
    assert got["after"] == [mine]  # every thread back on what the process had


@needs_affinity
@pytest.mark.parametrize("bad", [-1, 4096, True, 1.0, "0"])
def test_a_cpu_the_process_may_not_use_is_refused_naming_those_it_may(bad: object) -> None:
    before = os.sched_getaffinity(0)
    allowed = ", ".join(str(c) for c in sorted(before))
    with pytest.raises(ValueError, match=f"pick one of {allowed}"):
        pin_to_cpu(bad)  # type: ignore[arg-type]
    assert os.sched_getaffinity(0) == before
    for cpus in ([], ["0"], [True]):
        with pytest.raises(ValueError, match="CPUs are whole numbers"):
            unpin_cpu(cpus)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="CPUs 4096 were refused"):
        unpin_cpu([4096])
    assert os.sched_getaffinity(0) == before


@needs_affinity
def test_serve_cpu_runs_the_whole_hub_on_that_cpu(tmp_path: Path) -> None:
    from tests.conftest import start_server

    cpu = max(os.sched_getaffinity(0))
    srv = start_server(tmp_path / "home", None, "--cpu", str(cpu))
    try:
        # the store's threads and the server's are up: it answered /healthz
        assert _allowed_of_every_thread(srv.proc.pid) == {str(cpu)}
    finally:
        srv.stop()


def test_serve_refuses_a_cpu_it_may_not_use_before_starting(tmp_path: Path) -> None:
    from tests.conftest import BIN

    done = subprocess.run(
        [str(BIN), "serve", "--port", "0", "--cpu", "4096"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "BACKCHANNEL_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert done.returncode == 2
    assert "--cpu" in done.stderr and "4096" in done.stderr
    assert not (tmp_path / "home" / "server.json").exists()
