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
from collections.abc import Callable, Hashable, Iterator, Sequence
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


def forked_map(fn: Callable[[T], R], items: Sequence[T],
               group: Callable[[T], Hashable] = id) -> Iterator[R]:
    """``fn`` of each item, in order; the children start now, before the iterator is read.

    Items of one ``group`` run one after the other in the same child, so they share what the
    first one caches (the what-ifs on the same cluster reuse its topology and group links; apart
    they cost more CPU than together); one child per group. A single group runs here, without a
    child. ``fn`` must be pure: a child's result is used as it is, and a failed item is computed
    again in this process.
    """
    keys = list(dict.fromkeys(group(item) for item in items))
    if (len(keys) < 2 or usable_cpus() < 2
            or "fork" not in multiprocessing.get_all_start_methods()):
        return (fn(item) for item in items)
    context = multiprocessing.get_context("fork")
    for stream in (sys.stdout, sys.stderr):  # a child must not repeat buffered output
        stream.flush()
    children = []
    for key in keys:
        receive, send = context.Pipe(duplex=False)
        batch = [item for item in items if group(item) == key]
        child = context.Process(target=_serve, args=(fn, batch, send), daemon=True)
        child.start()
        send.close()
        children.append((key, child, receive))
    return _results(fn, items, group, children)


def _results(fn: Callable[[T], R], items: Sequence[T], group: Callable[[T], Hashable],
             children: list[tuple[Hashable, Any, Connection]]) -> Iterator[R]:
    pipes = {key: receive for key, _, receive in children}
    try:
        for item in items:
            try:
                status, value = pipes[group(item)].recv()
            except (EOFError, OSError):
                status, value = "failed", None
            yield value if status == "ok" else fn(item)
    finally:
        for _, child, receive in children:
            receive.close()
            if child.is_alive():
                child.terminate()
            child.join()
