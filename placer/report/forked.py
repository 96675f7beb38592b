"""Independent computations in forked child processes, their results in order.

The what-ifs are three more searches that need nothing from one another; with a second core,
forked children solve them while this process prints the main answer (sampled on the 2-core
development machine, they were 40 % of GPT-3's command). A forked child starts from this
process's memory, so nothing is imported or loaded again, and sends back only its results
(pickled). Where fork is unavailable, on one CPU, or when a child fails in any way, the item is
computed here instead: which process computed a result never changes it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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


def forked_map(fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
    """``fn`` of each item, in order; the children start now, before the iterator is read.

    One child per item (the items are few: three what-ifs), so two CPUs share three searches
    evenly instead of one child solving two of them after the other. ``fn`` must be pure: a
    child's result is used as it is, and a failed item is computed again in this process.
    """
    workers = len(items)
    if usable_cpus() < 2 or not items or "fork" not in multiprocessing.get_all_start_methods():
        return (fn(item) for item in items)
    context = multiprocessing.get_context("fork")
    for stream in (sys.stdout, sys.stderr):  # a child must not repeat buffered output
        stream.flush()
    children = []
    for index in range(workers):
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_serve, args=(fn, items[index::workers], send),
                                daemon=True)
        child.start()
        send.close()
        children.append((child, receive))
    return _results(fn, items, children)


def _results(fn: Callable[[T], R], items: Sequence[T],
             children: list[tuple[Any, Connection]]) -> Iterator[R]:
    try:
        for index, item in enumerate(items):
            _, receive = children[index % len(children)]
            try:
                status, value = receive.recv()
            except (EOFError, OSError):
                status, value = "failed", None
            yield value if status == "ok" else fn(item)
    finally:
        for child, receive in children:
            receive.close()
            if child.is_alive():
                child.terminate()
            child.join()
