"""Small hashable keys for the cost model's caches, and the bounded caches they index.

One search costs thousands of layouts of the same model, cluster and job; the what-ifs search the
same model again at half and twice the global batch (and on twice the nodes), where most of
what a layout costs per micro-batch is the same (``step.estimate_with``). Hashing the pydantic
inputs on every call costs as much as the work it would save (an earlier memo keyed on them was
dropped, bench/results/search_speed-2026-12-01.md), so each input object is written out once,
as its JSON text, remembered by identity (the object is kept with it, so a reused id never
matches), and the caches key on those texts (a string caches its own hash) and on plain ints,
strings and frozen dataclasses. Keys are values, never identities, so a cache hit is exactly
the result the same inputs would compute again; the inputs are frozen models.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from pydantic import BaseModel

from placer.spec.layout import Layout

V = TypeVar("V")

CACHE_ENTRIES = 20_000
"""Entries kept per cache: a DeepSeek-V3 search on 2,048 GPUs costs ~5,000 layouts; the oldest
entry goes first beyond this, so a long-running process (a benchmark, a fit) stays bounded."""

BATCH_FIELDS = frozenset({"global_batch_size"})
"""The job's fields a micro-batch's cost does not read (``text_key(job, BATCH_FIELDS)``)."""

DP_FIELDS = ("dp", "dp_shard", "zero_stage", "reshard_after_forward")
"""Layout fields only data-parallel state and traffic read (ZeRO shards, gathers, the gradient
reduction): a micro-batch's compute, its TP, CP and EP traffic and its activations are the same
for any of them, so keys of those leave them out (``layout_fields(layout, DP_FIELDS)``)."""

_CACHES: list[dict[Any, Any]] = []


def new_cache() -> dict[Any, Any]:
    """An empty cache that ``clear_caches`` empties."""
    cache: dict[Any, Any] = {}
    _CACHES.append(cache)
    return cache


def clear_caches() -> None:
    """Empty every cache (a test that costs the same inputs afresh)."""
    for cache in _CACHES:
        cache.clear()


_TEXTS: dict[tuple[int, frozenset[str]], tuple[object, str]] = new_cache()


def text_key(obj: BaseModel, exclude: frozenset[str] = frozenset()) -> str:
    """``obj``'s JSON text without the fields in ``exclude``, computed once per object."""
    slot = (id(obj), exclude)
    hit = _TEXTS.get(slot)
    if hit is not None and hit[0] is obj:
        return hit[1]
    text = obj.model_dump_json(exclude=set(exclude) or None)
    remember(_TEXTS, slot, (obj, text))
    return text


_CONSTANTS: dict[int, tuple[object, str]] = new_cache()


def register_constants(calib: object) -> None:
    """Mark ``calib`` as resolved by ``profile.calibration_for`` (not a caller's tuned copy, as
    a fit makes one per call): caches may key on its ``repr`` (``constants_key``)."""
    remember(_CONSTANTS, id(calib), (calib, repr(calib)))


def constants_key(calib: object) -> str | None:
    """The ``repr`` of a registered ``calib`` (every constant, the GPU and the profile); None
    for any other, which the caches then leave alone."""
    hit = _CONSTANTS.get(id(calib))
    return hit[1] if hit is not None and hit[0] is calib else None


def layout_fields(layout: Layout, exclude: tuple[str, ...] = ()) -> tuple[Hashable, ...]:
    """Every field of ``layout`` (all ints, strings, bools and tuples) but those in ``exclude``,
    in declaration order: no pydantic hashing."""
    if not exclude:
        return tuple(layout.__dict__.values())
    return tuple(value for name, value in layout.__dict__.items() if name not in exclude)


def remember(cache: dict[Any, V], key: Any, value: V) -> V:
    """Store ``value`` under ``key``, dropping the oldest entry beyond ``CACHE_ENTRIES``."""
    cache[key] = value
    if len(cache) > CACHE_ENTRIES:
        del cache[next(iter(cache))]
    return value


def cached(cache: dict[Any, V], key: Any, make: Callable[[], V]) -> V:
    """``cache[key]``, made and remembered on a miss."""
    hit = cache.get(key)
    if hit is None:
        hit = remember(cache, key, make())
    return hit
