"""One training step of a candidate, as a program every rank can replay, and its predicted time.

The program is built from the cost model's own account of the step (``Estimate.collectives`` and
``Estimate.breakdown``), every size multiplied by ``scale``:

- per micro-batch and layer, a compute stand-in (``n x n`` GEMMs worth the predicted compute time)
  cut into pieces between that layer's TP collectives, MoE all-to-alls and CP K/V exchanges,
  forward then backward (with full recomputation a third of the per-layer calls are the
  backward's redo);
- stage-boundary activations and gradients sent between pipeline stages in 1F1B order
  (interleaved schedules are replayed as plain 1F1B);
- ZeRO-3 parameter gathers per micro-batch, and the DP/ZeRO gradient collectives at the end.

Nothing overlaps in the replay, so the prediction of *what the replay runs* is a simulation of
these programs with each op timed by the cost model (placer/cost/collectives.py on the group's
links, with the link profile) at the replay's sizes: collectives wait for their group, a receive
for its send, and the step ends when the slowest stage does. The optimizer step is not replayed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from placer.cost import collectives as coll
from placer.cost.collectives import CollectiveTime, GroupLink
from placer.cost.compute import gemm_time
from placer.cost.groups import GroupLinks
from placer.cost.params import stage_shapes
from placer.cost.profile import Calibration
from placer.cost.step import LAYER_CALLS
from placer.dims import Group, Part
from placer.errors import PlacerError
from placer.spec.documents import REPLAY_FORMAT, ReplayProgramDocument, document
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.results import CollectiveCost, Estimate
from placer.verify.workers.sizes import real_bytes

# Square GEMM sizes the stand-in may use; the largest whose call fits 4 times in the smallest
# compute piece is chosen, so rounding a piece to whole calls costs at most ~12 % (the
# prediction counts the whole calls the replay makes, so this is fidelity, not accuracy).
GEMM_SIZES = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
CALLS_PER_PIECE = 4
# The backward pass of a layer does about twice the forward's GEMM work (dgrad + wgrad).
FORWARD_SHARE = 1.0 / 3.0
COLLECTIVE_FUNCTIONS = {
    "all_reduce": coll.all_reduce, "all_gather": coll.all_gather,
    "reduce_scatter": coll.reduce_scatter, "all_to_all": coll.all_to_all,
    "send_recv": coll.send_recv,
}


@dataclass(frozen=True)
class OpKind:
    """One distinct communication op of the replay: a collective of one size on one group."""

    id: int
    dimension: str
    collective: str
    message_bytes: int
    group_size: int
    group: str
    link_class: str
    time_s: float

    def document(self) -> dict[str, Any]:
        return {"id": self.id, "dimension": self.dimension, "collective": self.collective,
                "bytes": self.message_bytes, "group_size": self.group_size, "group": self.group,
                "link_class": self.link_class, "predicted_s": self.time_s}


Op = tuple[str, int]
"""("g", calls): GEMMs; ("c", kind): collective; ("x", kind): CP ring exchange;
("s"/"r", kind): activation send to / receive from the next / previous stage;
("S"/"R", kind): gradient send to / receive from the previous / next stage."""


@dataclass(frozen=True)
class ReplayProgram:
    """Every stage's op list for one step, the op kinds, and the simulated step time."""

    layout: Layout
    scale: float
    microbatches: int
    layers: int
    kinds: tuple[OpKind, ...]
    stages: tuple[tuple[Op, ...], ...]
    gemm_n: int
    gemm_call_s: float
    predicted_step_s: float
    predicted_parts: dict[str, float] = field(default_factory=dict)
    kind_links: tuple[GroupLink, ...] = field(default=(), compare=False, repr=False)

    def document(self) -> dict[str, Any]:
        """What the replay worker reads (besides the rank map)."""
        return document(ReplayProgramDocument, {
            "format": REPLAY_FORMAT, "gemm_n": self.gemm_n,
            "kinds": [k.document() for k in self.kinds],
            "stages": [[list(op) for op in ops] for ops in self.stages]})


def _split(total: int, slots: int) -> list[int]:
    """``total`` calls over ``slots`` positions as evenly as whole numbers allow."""
    return [((k + 1) * total) // slots - (k * total) // slots for k in range(slots)]


def link_for(row: CollectiveCost, links: GroupLinks) -> GroupLink:
    """The link of the group a ledger row runs on; its size must be the row's."""
    link = links.get(row.group)
    if link is None or link.size != row.group_size:
        raise PlacerError(
            f"the estimate's {row.dimension} {row.collective} on group {row.group} (of "
            f"{row.group_size} ranks) matches none of this placement's groups "
            f"({', '.join(f'{g} of {k.size}' for g, k in sorted(links.items()))}); "
            "write the plan again with this placer version")
    return link


def time_call(collective: str, link: GroupLink, nbytes: int, calib: Calibration
              ) -> CollectiveTime:
    """The cost model's time of one call of ``nbytes`` on ``link``."""
    return COLLECTIVE_FUNCTIONS[collective](link, nbytes, calib)


def gemm_call_s(n: int, calib: Calibration, precision: str) -> float:
    """The cost model's time of one ``n x n x n`` GEMM run alone (placer/cost/compute.py).

    The replay fills each predicted compute piece with such calls, which run alone on the
    device; the cost model's sustained fraction (other kernels beside a training step's GEMMs)
    is already in the piece's predicted time, so it is left out of the call's."""
    alone = calib.gemm_efficiency(precision) / calib.gemm_sustained_fraction
    return gemm_time(2.0 * n**3, calib.peak_flops(precision), alone,
                     calib.gemm.half_efficiency_flops or 0.0)


def compute_chunks_s(est: Estimate, model: Model, job: Job, scale: float
                     ) -> tuple[float, float, int, int]:
    """(forward, backward) compute seconds of one layer and micro-batch, scaled; m; layers.

    The worst stage's compute (what the breakdown reports) spread over its layers; every stage
    replays it, so stages are even.
    """
    layers = max(shape.layers for shape in stage_shapes(model, est.layout))
    m = max(1, est.layout.num_microbatches(job.global_batch_size))
    per = scale / (m * layers)
    forward = est.breakdown.compute_s * FORWARD_SHARE * per
    backward = (est.breakdown.compute_s * (1 - FORWARD_SHARE) + est.breakdown.recompute_s) * per
    return forward, backward, m, layers


def choose_gemm_n(min_piece_s: float, calib: Calibration, precision: str) -> int:
    """Largest GEMM size whose call fits ``CALLS_PER_PIECE`` times in the smallest piece."""
    chosen = GEMM_SIZES[0]
    for n in GEMM_SIZES:
        if gemm_call_s(n, calib, precision) * CALLS_PER_PIECE <= min_piece_s:
            chosen = n
    return chosen


class _Kinds:
    """Distinct op kinds in first-use order, each timed once by the cost model."""

    def __init__(self, links: GroupLinks, calib: Calibration) -> None:
        self.links, self.calib = links, calib
        self.kinds: list[OpKind] = []
        self.kind_links: list[GroupLink] = []
        self._index: dict[tuple[Part, str, int, Group], int] = {}

    def get(self, dimension: Part, collective: str, nbytes: float, group: Group,
            link: GroupLink) -> int:
        size = real_bytes(collective, max(1, round(nbytes)), link.size)
        ident = (dimension, collective, size, group)
        if ident not in self._index:
            one = time_call(collective, link, size, self.calib)
            self._index[ident] = len(self.kinds)
            self.kinds.append(OpKind(len(self.kinds), dimension, collective, size, link.size,
                                     group, link.link_class, one.time_s))
            self.kind_links.append(link)
        return self._index[ident]


def forward_calls(dimension: Part, calls: int, layout: Layout) -> int:
    """How many of a layer's per-micro-batch calls the (first) forward pass issues; the rest
    run in the backward, with full recomputation after its redone forward (``LAYER_CALLS``)."""
    return LAYER_CALLS[dimension].first_forward(calls, layout)


def smallest_part_s(est: Estimate, model: Model, job: Job, scale: float) -> float:
    """The shortest compute piece of the replay: a layer's pass split at its collectives."""
    fwd_s, bwd_s, m, layers = compute_chunks_s(est, model, job, scale)
    per_fwd = per_bwd = 0
    for row in est.collectives:
        if row.dimension in LAYER_CALLS:
            calls = -(-row.calls_per_step // (m * layers))
            fwd = forward_calls(row.dimension, calls, est.layout)
            per_fwd, per_bwd = per_fwd + fwd, per_bwd + calls - fwd
    return min(fwd_s / max(1, per_fwd), bwd_s / max(1, per_bwd))


@dataclass
class LayerOps:
    """Ops of one layer in one pass, before and after its compute."""

    forward: list[Op] = field(default_factory=list)
    backward: list[Op] = field(default_factory=list)


def _per_layer_ops(rows: Sequence[CollectiveCost], kinds: _Kinds, layout: Layout, m: int,
                   layers: int, scale: float) -> tuple[list[list[LayerOps]], list[Op], list[Op],
                                                       list[Op], int | None, int | None]:
    """Split the ledger into per-(micro-batch, layer) ops, per-micro-batch ZeRO ops, end-of-step
    DP ops, and the pipeline's activation / gradient kinds."""
    grid = [[LayerOps() for _ in range(layers)] for _ in range(m)]
    zero_fwd: list[Op] = []
    zero_bwd: list[Op] = []
    end: list[Op] = []
    act = grad = None
    for row in rows:
        link = link_for(row, kinds.links)
        kind = kinds.get(row.dimension, row.collective, row.message_bytes * scale, row.group,
                         link)
        if row.dimension in LAYER_CALLS:
            op: Op = ("x", kind) if row.dimension == Part.CP else ("c", kind)
            slots = _split(row.calls_per_step, m * layers)
            for index, calls in enumerate(slots):
                layer = grid[index // layers][index % layers]
                forward = forward_calls(row.dimension, calls, layout)
                layer.forward += [op] * forward
                layer.backward += [op] * (calls - forward)
        elif row.dimension == Part.PP:
            act = grad = kind
        elif row.dimension == Part.ZERO and row.collective == "all_gather":
            zero_fwd.append(("c", kind))
            zero_bwd.append(("c", kind))
        elif row.dimension == Part.ZERO:
            zero_bwd.append(("c", kind))
        else:  # dp: the gradient reduction (and parameter gather) once per step
            end += [("c", kind)] * row.calls_per_step
    return grid, zero_fwd, zero_bwd, end, act, grad


def _pass(ops: list[Op], gemms: int, collectives: list[Op]) -> None:
    """One layer's pass: its compute cut into one piece per collective, each followed by it
    (attention, all-reduce, MLP, all-reduce, as Megatron's layers run)."""
    pieces = max(1, len(collectives))
    for k, calls in enumerate(_split(gemms, pieces)):
        if calls:
            ops.append(("g", calls))
        if k < len(collectives):
            ops.append(collectives[k])


def stage_program(stage: int, stages: int, m: int, grid: list[list[LayerOps]],
                   gemm_fwd: int, gemm_bwd: int, zero_fwd: list[Op], zero_bwd: list[Op],
                   end: list[Op], act: int | None, grad: int | None) -> list[Op]:
    """1F1B: warm-up forwards, then one forward and one backward at a time, then the rest."""
    ops: list[Op] = []

    def forward(mb: int) -> None:
        if stage > 0 and act is not None:
            ops.append(("r", act))
        ops.extend(zero_fwd)
        for layer in grid[mb]:
            _pass(ops, gemm_fwd, layer.forward)
        if stage < stages - 1 and act is not None:
            ops.append(("s", act))

    def backward(mb: int) -> None:
        if stage < stages - 1 and grad is not None:
            ops.append(("R", grad))
        for layer in reversed(grid[mb]):
            _pass(ops, gemm_bwd, layer.backward)
        ops.extend(zero_bwd)
        if stage > 0 and grad is not None:
            ops.append(("S", grad))

    warmup = min(stages - stage - 1, m)
    for mb in range(warmup):
        forward(mb)
    for k in range(m - warmup):
        forward(warmup + k)
        backward(k)
    for mb in range(m - warmup, m):
        backward(mb)
    ops.extend(end)
    return ops


def build_program(est: Estimate, model: Model, job: Job, links: GroupLinks, calib: Calibration,
                  scale: float, gemm_n: int) -> ReplayProgram:
    """The replay of ``est`` at ``scale``, with its predicted (simulated) step time."""
    if not 0 < scale <= 1:
        raise PlacerError(f"--scale: {scale} is not valid; use a factor in (0, 1]")
    layout = est.layout
    fwd_s, bwd_s, m, layers = compute_chunks_s(est, model, job, scale)
    call_s = gemm_call_s(gemm_n, calib, job.precision)
    gemm_fwd, gemm_bwd = round(fwd_s / call_s), round(bwd_s / call_s)
    kinds = _Kinds(links, calib)
    grid, zero_fwd, zero_bwd, end, act, grad = _per_layer_ops(
        est.collectives, kinds, layout, m, layers, scale)
    stages = tuple(tuple(stage_program(s, layout.pp, m, grid, gemm_fwd, gemm_bwd, zero_fwd,
                                        zero_bwd, end, act, grad)) for s in range(layout.pp))
    program = ReplayProgram(layout=layout, scale=scale, microbatches=m, layers=layers,
                            kinds=tuple(kinds.kinds), stages=stages, gemm_n=gemm_n,
                            gemm_call_s=call_s, predicted_step_s=0.0,
                            kind_links=tuple(kinds.kind_links))
    step, parts = simulate(program, [k.time_s for k in program.kinds], call_s)
    return replace(program, predicted_step_s=step, predicted_parts=parts)


def repredict(program: ReplayProgram, calib: Calibration, precision: str
              ) -> tuple[float, dict[str, float]]:
    """The same program's step time under other hardware figures (e.g. a refitted profile)."""
    kind_s = [time_call(k.collective, link, k.message_bytes, calib).time_s
              for k, link in zip(program.kinds, program.kind_links, strict=True)]
    return simulate(program, kind_s, gemm_call_s(program.gemm_n, calib, precision))


def simulate(program: ReplayProgram, kind_s: Sequence[float], gemm_call_s: float
             ) -> tuple[float, dict[str, float]]:
    """Step time of ``program`` with per-call op times ``kind_s`` and GEMM call time.

    One clock per stage (ranks of a stage run the same ops and every group but the pipeline's
    lies within a stage). A send is non-blocking; its receive completes at
    ``max(posted, sent + transfer)``. Returns the step time and, for the stage that finishes
    last, the seconds spent per part (compute, each dimension, and waiting).
    """
    stages = program.stages
    clocks = [0.0] * len(stages)
    position = [0] * len(stages)
    busy = [dict[str, float]() for _ in stages]
    # Messages in flight per (from, to) stage pair: FIFO of arrival times.
    inbox: dict[tuple[int, int], list[float]] = {}
    kinds = program.kinds
    progressed = True
    while progressed:
        progressed = False
        for s, ops in enumerate(stages):
            while position[s] < len(ops):
                name, arg = ops[position[s]]
                if name in ("r", "R"):
                    source = s - 1 if name == "r" else s + 1
                    queue = inbox.get((source, s))
                    if not queue:
                        break  # wait for the sender
                    arrival = queue.pop(0)
                    if arrival > clocks[s]:
                        busy[s]["wait"] = busy[s].get("wait", 0.0) + arrival - clocks[s]
                        clocks[s] = arrival
                elif name in ("s", "S"):
                    target = s + 1 if name == "s" else s - 1
                    transfer = kind_s[arg]
                    inbox.setdefault((s, target), []).append(clocks[s] + transfer)
                else:
                    if name == "g":
                        seconds, part = arg * gemm_call_s, "compute"
                    else:
                        seconds, part = kind_s[arg], kinds[arg].dimension
                    busy[s][part] = busy[s].get(part, 0.0) + seconds
                    clocks[s] += seconds
                position[s] += 1
                progressed = True
    if any(position[s] < len(ops) for s, ops in enumerate(stages)):
        raise PlacerError("internal: the replay schedule deadlocks (a receive has no send)")
    last = max(range(len(stages)), key=lambda s: clocks[s])
    parts = {k: v for k, v in sorted(busy[last].items()) if v > 0}
    return clocks[last], parts
