"""Independent computations in forked child processes, their results in order.

The what-ifs are three more searches that need nothing from one another; with a second core,
forked children solve them while this process prints the main answer, and with CPUs to spare
some start while it searches (whatif.SHARED_CPUS; sampled on the 2-core development machine,
they were 40 % of GPT-3's command). A forked child starts from
this process's memory, so nothing is imported or loaded again, and sends back only its results
(pickled). Where fork is unavailable, on one CPU, or when a child fails in any way, the item is
computed here instead: which process computed a result never changes it.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether forked children can run beside this process: a second CPU and fork."""
    return usable_cpus() >= 2 and "fork" in multiprocessing.get_all_start_methods()


def _serve(fn: Callable[[Any], Any], batch: Sequence[Any], conn: Connection) -> None:
    """A child's loop: each item's result, or word that it failed (the parent redoes it).
    Ctrl-C is the parent's to handle: it ends the children when it stops reading."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with conn:
        for item in batch:
            try:
                message = ("ok", fn(item))
            except Exception:  # noqa: BLE001 - any failure: the parent computes the item itself
                message = ("failed", None)
            try:
                conn.send(message)
            except OSError:  # the parent has stopped reading
                return
            except Exception:  # noqa: BLE001 - a result that does not pickle
                conn.send(("failed", None))


class ForkedRuns(Generic[T, R]):
    """``fn`` of each of ``items``, computed in forked children started when the caller says
    (``start``: some before other work of this process, the rest with ``results``), read back
    in the items' order. ``fn`` must be pure: a child's result is used as it is, and an item
    whose child failed, or that no child computes (one CPU, no fork), is computed here."""

    def __init__(self, fn: Callable[[T], R], items: Sequence[T]) -> None:
        self._fn, self._items = fn, list(items)
        self._fork = can_fork()
        self._child_of: dict[int, int] = {}
        self._children: list[tuple[Any, Connection]] = []

    def start(self, indices: Iterable[int]) -> None:
        """Fork a child now for each item at ``indices`` not started yet. Nothing where children
        cannot run (``can_fork``)."""
        todo = [i for i in indices if i not in self._child_of]
        if not self._fork or not todo:
            return
        context = multiprocessing.get_context("fork")
        for stream in (sys.stdout, sys.stderr):  # a child must not repeat buffered output
            stream.flush()
        # The children start with this process's objects in the collector's permanent
        # generation, so their collections do not walk (nor touch the pages of) what they
        # inherit, the main search's caches; this process's is unfrozen again (unless it was
        # frozen before).
        frozen = gc.get_freeze_count()
        gc.freeze()
        try:
            for index in todo:
                receive, send = context.Pipe(duplex=False)
                child = context.Process(target=_serve,
                                        args=(self._fn, [self._items[index]], send), daemon=True)
                child.start()
                send.close()
                self._child_of[index] = len(self._children)
                self._children.append((child, receive))
        finally:
            if not frozen:
                gc.unfreeze()

    def results(self) -> Iterator[R]:
        """Every item's result in order; the items not started yet start now, one child each."""
        self.start(range(len(self._items)))
        return self._read()

    def _read(self) -> Iterator[R]:
        try:
            for index, item in enumerate(self._items):
                child = self._child_of.get(index)
                if child is None:
                    yield self._fn(item)
                    continue
                try:
                    status, value = self._children[child][1].recv()
                except (EOFError, OSError):
                    status, value = "failed", None
                yield value if status == "ok" else self._fn(item)
        finally:
            self.close()

    def close(self) -> None:
        """End the children (those still running are terminated): their results go unread."""
        for child, receive in self._children:
            receive.close()
            if child.is_alive():
                child.terminate()
            child.join()
        self._children.clear()
        self._child_of.clear()
        self._fork = False

