"""ForkedRuns: results in order from forked children, failures redone here, one CPU in-process."""

from __future__ import annotations

import gc
import os
import time

import pytest

from placer.report import forked
from placer.report.forked import ForkedRuns

needs_fork = pytest.mark.skipif(forked.usable_cpus() < 2 or not hasattr(os, "fork"),
                                reason="needs fork and two usable CPUs")


@needs_fork
def test_results_come_from_children_in_order() -> None:
    parent = os.getpid()
    results = list(ForkedRuns(lambda n: (n * n, os.getpid()), list(range(5))).results())
    assert [square for square, _ in results] == [0, 1, 4, 9, 16]
    pids = {pid for _, pid in results}
    assert parent not in pids and len(pids) == 5  # one child each


@needs_fork
def test_a_failed_or_unpicklable_item_is_computed_here() -> None:
    parent = os.getpid()

    def fn(n: int) -> object:
        if n == 1 and os.getpid() != parent:
            raise RuntimeError("only in a child")
        if n == 2 and os.getpid() != parent:
            return lambda: n  # a child cannot pickle it; the parent's own result is used
        return ("here" if os.getpid() == parent else "child", n)

    results = list(ForkedRuns(fn, [0, 1, 2, 3]).results())
    assert results[0] == ("child", 0) and results[1] == ("here", 1)
    assert results[2] == ("here", 2) and results[3] == ("child", 3)


@needs_fork
def test_children_start_before_the_results_are_read(tmp_path) -> None:
    marks = [tmp_path / f"{n}" for n in range(2)]
    runs = ForkedRuns(lambda n: marks[n].write_text("done") and n, [0, 1])
    runs.start(range(2))
    deadline = time.monotonic() + 10
    while not all(m.exists() for m in marks) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(m.exists() for m in marks)
    assert list(runs.results()) == [0, 1]


@needs_fork
def test_children_inherit_a_frozen_heap_and_the_parent_keeps_its_collector() -> None:
    inherited = [object() for _ in range(1000)]  # alive when the children are forked
    before = gc.get_freeze_count()
    runs = ForkedRuns(lambda _n: gc.get_freeze_count(), [0, 1])
    runs.start([0])
    assert gc.get_freeze_count() == before
    frozen = list(runs.results())  # the second child is forked here
    assert all(count >= before + len(inherited) for count in frozen)
    assert gc.get_freeze_count() == before


def test_one_cpu_computes_in_this_process(monkeypatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 1)
    parent = os.getpid()
    assert list(ForkedRuns(lambda n: (n, os.getpid()), [3, 4]).results()) == [(3, parent),
                                                                         (4, parent)]


@needs_fork
def test_started_items_run_before_results_and_come_back_in_item_order(tmp_path) -> None:
    """``ForkedRuns.start`` forks the named items at once (the what-ifs beside the main
    search); ``results`` starts the rest, one child each, and yields in the items' order."""
    parent = os.getpid()
    marks = [tmp_path / f"{n}" for n in range(3)]

    def fn(n: int) -> tuple[int, int]:
        marks[n].write_text("done")
        return n, os.getpid()

    runs = forked.ForkedRuns(fn, [0, 1, 2])
    runs.start([2])
    deadline = time.monotonic() + 10
    while not marks[2].exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert marks[2].exists() and not marks[0].exists() and not marks[1].exists()
    results = list(runs.results())
    assert [n for n, _ in results] == [0, 1, 2]
    pids = {pid for _, pid in results}
    assert parent not in pids and len(pids) == 3


def test_runs_on_one_cpu_compute_every_item_here(monkeypatch) -> None:
    """Without a second CPU nothing is forked and every item is computed here, in order."""
    monkeypatch.setattr(forked, "usable_cpus", lambda: 1)
    parent = os.getpid()
    runs = forked.ForkedRuns(lambda n: (n, os.getpid()), [5, 6])
    runs.start([1])
    assert list(runs.results()) == [(5, parent), (6, parent)]
