"""What every framework dialect shares: the placed candidate it writes, rank orders, versions.

A dialect module owns one framework's file format: the names it writes and reads, the framework
versions it supports and the rules those versions enforce. It sits below ``launch`` (which
writes the files) and ``check`` (which reads them), so a flag cannot be written one way and read
another. It imports only ``spec``, ``mesh`` and ``errors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from placer.errors import InputError
from placer.mesh import MeshGrid, order_text, parse_order
from placer.spec import Candidate, Layout, Plan
from placer.spec.pipeline import PipelineSplit


class Placed(Protocol):
    """A checked candidate of a plan, as ``placer.launch.rankmap.PlacedCandidate`` provides it."""

    @property
    def plan(self) -> Plan: ...

    @property
    def candidate(self) -> Candidate: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def grid(self) -> MeshGrid: ...

    @property
    def is_identity(self) -> bool: ...


@dataclass(frozen=True)
class RankOrder:
    """A framework's fixed rank order, spelled as the framework spells it, and its switch.

    ``text`` is innermost first (Megatron's ``tp-cp-ep-dp-pp``); ``dims`` is placer's dense
    order (``ep`` dropped: experts follow the dense order).
    """

    text: str
    flag: str | None = None

    @property
    def dims(self) -> tuple[str, ...]:
        return parse_order(self.text)


@dataclass(frozen=True)
class OrderFit:
    """Whether a framework's fixed rank order realises the plan's rank map, and how."""

    expressible: bool
    flag: str | None
    explanation: str


def _effective(order: tuple[str, ...], layout: Layout) -> tuple[str, ...]:
    """The order without size-1 dims, which do not change any rank's group."""
    sizes = {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp, "pp": layout.pp}
    return tuple(d for d in order if sizes[d] > 1)


def order_fit(placed: Placed, orders: tuple[RankOrder, ...], framework: str) -> OrderFit:
    """Say whether one of ``orders`` gives the plan's groups over torchrun's ranks."""
    plan_order = _effective(placed.grid.order, placed.layout)
    matches = [o for o in orders if _effective(o.dims, placed.layout) == plan_order]
    names = " or ".join(order_text(o.dims) for o in orders)
    if matches and placed.is_identity:
        order = matches[0]
        how = f" (with {order.flag})" if order.flag else ""
        return OrderFit(True, order.flag, f"{framework}'s rank order {order_text(order.dims)}"
                        f"{how} gives exactly the plan's groups over torchrun's ranks.")
    if matches:
        reason = ("the plan permutes ranks (not consecutive torchrun ranks in "
                  f"{order_text(placed.grid.order)} order)")
    else:
        reason = f"the plan's order is {order_text(placed.grid.order)}"
    return OrderFit(False, None, (
        f"{framework} cannot express this rank map: it builds its groups from consecutive "
        f"ranks in the order {names}, and {reason}. Either build the groups from placer_mesh "
        "(pm.group('tp'), pm.mesh) and hand them to the framework, or accept the framework's "
        "order, which is not the placement placer estimated."))


def version_key(text: str) -> tuple[int, ...]:
    """``"0.2.2"`` -> ``(0, 2, 2)``; a leading ``v`` and a ``core_v`` prefix are accepted."""
    cleaned = text.strip().lower().removeprefix("core_").removeprefix("v")
    parts = cleaned.split(".")
    if not cleaned or not all(p.isdigit() for p in parts):
        raise ValueError(text)
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class Target:
    """One framework target: the release series placer writes for, and the default.

    ``series`` are release prefixes, oldest first (``"0.2"`` covers 0.2.0 .. 0.2.x); a
    version given by the user is matched to the series it belongs to.
    """

    name: str
    label: str
    series: tuple[str, ...]
    default: str
    package: str

    def resolve(self, text: str | None) -> str:
        """The supported series ``text`` belongs to (the default for None); InputError else."""
        if text is None:
            return self.default
        supported = ", ".join(self.series)
        fix = f"use one of {supported} (a release like {self.series[-1]}.1 matches its series)"
        try:
            wanted = version_key(text)
        except ValueError:
            raise InputError("--framework-version", f"{self.name}={text}", fix) from None
        for series in self.series:
            key = version_key(series)
            if wanted[:len(key)] == key:
                return series
        raise InputError("--framework-version", f"{self.name}={text}",
                         f"placer writes {self.label} {supported}; {fix}")


@dataclass(frozen=True)
class Refusal:
    """A plan the target version rejects: which file, why, and what to change."""

    file: str
    target: Target
    version: str
    reason: str

    def line(self) -> str:
        return f"{self.file} not written: {self.target.label} {self.version} {self.reason}"


def pipeline_split(placed: Placed) -> PipelineSplit:
    """The decoder layers of every virtual stage: the layout's own split, else the candidate's
    per-stage counts, else the even split.

    The search gives a stage whole virtual stages (``solver.stages.split_layers``: a multiple of
    vpp layers each), so with virtual stages each of a rank's chunks holds its count / vpp."""
    layout, model = placed.layout, placed.plan.model
    stages = placed.candidate.stage_layers
    knobs = (layout.first_stage_layers, layout.last_stage_layers, layout.pp_layout,
             layout.stage_layers, layout.embedding_in_split or None, layout.loss_in_split or None)
    even = layout.pipeline_split(model.num_layers)
    if stages is None or any(k is not None for k in knobs) or list(stages) == even.rank_layers:
        return even
    if layout.vpp == 1:
        return PipelineSplit(tuple(stages), layout.pp)
    if any(count % layout.vpp for count in stages):
        raise InputError("candidate.stage_layers", list(stages),
                         f"give each stage a multiple of vpp={layout.vpp} layers")
    chunks = tuple(stages[even.rank_of(chunk)] // layout.vpp
                   for chunk in range(layout.pp * layout.vpp))
    return PipelineSplit(chunks, layout.pp, v_shape=even.v_shape)
