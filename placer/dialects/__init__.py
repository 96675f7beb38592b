"""One module per framework dialect placer writes and reads, with the versions it targets.

``launch`` writes these files and ``check`` reads them through the same names, so a flag
cannot be written one way and read another. Each module exports ``TARGET`` (the release
series it supports and the default), the name tables readers need, the writer, and
``refusals(placed, version)``: what that version rejects in a plan, with the reason.
"""

from __future__ import annotations

from placer.dialects import deepspeed, megatron, megatron_bridge, torchtitan
from placer.dialects.base import OrderFit, Placed, RankOrder, Refusal, Target, order_fit
from placer.errors import InputError

TARGETS: dict[str, Target] = {t.name: t for t in (megatron.TARGET, megatron_bridge.TARGET,
                                                   torchtitan.TARGET, deepspeed.TARGET)}

__all__ = ["TARGETS", "OrderFit", "Placed", "RankOrder", "Refusal", "Target", "order_fit",
           "resolve_versions"]


def resolve_versions(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["torchtitan=0.2.2"]`` -> every target's series (defaults for the ones not named)."""
    chosen = {name: target.default for name, target in TARGETS.items()}
    for pair in pairs:
        name, eq, version = pair.partition("=")
        target = TARGETS.get(name.strip().lower())
        if not eq or target is None:
            raise InputError("--framework-version", pair,
                             "give TARGET=VERSION with TARGET one of " + ", ".join(TARGETS))
        chosen[target.name] = target.resolve(version)
    return chosen
