"""The reduced CP-SAT placement model: cut a row of whole TP groups into node-sized chunks.

A generic rank-by-GPU boolean model does not scale (cpu-cluster-notes.md section 5: 526k
variables and no solution in 10 s at 4,096 GPUs; no optimality proof even at 512). Placement has
symmetry to exploit instead: TP groups are indivisible (they must stay inside an NVLink domain),
and along a mesh order the grid neighbours of a TP group are a few fixed strides away. So the
units are whole TP groups in mesh order, a *bin* (a node, or an NVLink domain spanning nodes) holds
a contiguous run of units no longer than its capacity, and the only choice left is where the runs
start and how long each is. That is a shortest path over positions 0..U with side constraints on
how many runs of each length the bins can take:

- ``y[p, l]`` = 1 when a run covers units ``p .. p+l-1``; flow conservation makes the runs tile
  0..U exactly;
- for every length ``l``: runs of length >= l <= bins with capacity >= l (by Hall's theorem on
  this nested structure, exactly the condition for assigning runs to distinct bins);
- objective: maximise the traffic weight inside runs (= minimise the weight of unit-graph edges
  that cross bins, the cross-node traffic proxy).

The best structured answer (fill bins in order, or in whole blocks of units that keep a mesh
group together) is the hint; the solver reports the best bound it proved, so the gap of the
proxy is always stated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from placer.solver.cpsat import deterministic_solver

if TYPE_CHECKING:  # loaded only where a model is solved (segment)
    from ortools.sat.python import cp_model

Edge = tuple[int, int, int]  # (unit u, unit v > u, integer weight)


@dataclass(frozen=True)
class Segmentation:
    """Runs of units in order, and the proxy's value, proven bound and solver status."""

    lengths: tuple[int, ...]
    cut_weight: int
    bound: int
    status: str
    hint_cut_weight: int
    total_weight: int


def internal_weights(num_units: int, edges: Sequence[Edge], max_len: int) -> list[list[int]]:
    """``inner[p][l - 1]`` = weight of edges with both ends in units ``p .. p+l-1``."""
    into: list[list[tuple[int, int]]] = [[] for _ in range(num_units)]
    for u, v, w in edges:
        if v - u < max_len:
            into[v].append((u, w))
    inner: list[list[int]] = []
    for p in range(num_units):
        row, acc = [], 0
        for end in range(p, min(num_units, p + max_len)):
            acc += sum(w for u, w in into[end] if u >= p)
            row.append(acc)
        inner.append(row)
    return inner


def greedy_lengths(num_units: int, capacities: Sequence[int]) -> tuple[int, ...] | None:
    """Fill bins in the given order, each as far as it goes (the structured placement)."""
    lengths, left = [], num_units
    for cap in capacities:
        if left == 0:
            break
        take = min(cap, left)
        if take > 0:
            lengths.append(take)
            left -= take
    return tuple(lengths) if left == 0 else None


def block_lengths(num_units: int, capacities: Sequence[int],
                  block: int) -> tuple[int, ...] | None:
    """Fill bins in order with whole blocks of ``block`` units only (bins that cannot take one
    are skipped; the last run takes what is left): keeps groups of that many units together."""
    lengths, left = [], num_units
    for cap in capacities:
        if left == 0:
            break
        take = min(cap - cap % block, left)
        if take > 0:
            lengths.append(take)
            left -= take
    return tuple(lengths) if left == 0 else None


def best_structured_lengths(num_units: int, capacities: Sequence[int], inner: list[list[int]],
                            total: int, max_len: int) -> tuple[int, ...] | None:
    """The lowest-cut of the structured fills: in order, or in whole blocks of 2..max_len units
    (a block that matches a group of the mesh keeps that group inside one bin when some bins
    have room for fewer units than others: failed GPUs). Ties keep the plain in-order fill."""
    best = greedy_lengths(num_units, capacities)
    if best is None:
        return None
    best_cut = cut_weight_of(best, inner, total)
    for block in range(2, max_len + 1):
        lengths = block_lengths(num_units, capacities, block)
        if lengths is not None and (cut := cut_weight_of(lengths, inner, total)) < best_cut:
            best, best_cut = lengths, cut
    return best


def cut_weight_of(lengths: Sequence[int], inner: list[list[int]], total: int) -> int:
    start, kept = 0, 0
    for length in lengths:
        kept += inner[start][length - 1]
        start += length
    return total - kept


def segment(num_units: int, edges: Sequence[Edge], capacities: Sequence[int], *,
            time_limit_s: float, hint: Sequence[int] | None = None) -> Segmentation | None:
    """Best runs for ``num_units`` units on bins of the given capacities (in units).

    Returns None when the bins cannot hold the units. Deterministic: one worker, fixed seed.
    """
    capacities = [c for c in capacities if c > 0]
    if sum(capacities) < num_units or num_units == 0:
        return None
    max_len = min(max(capacities), num_units)
    inner = internal_weights(num_units, edges, max_len)
    total = sum(w for _, _, w in edges)
    start_hint = (tuple(hint) if hint
                  else best_structured_lengths(num_units, capacities, inner, total, max_len))
    if start_hint is None:
        return None
    hint_cut = cut_weight_of(start_hint, inner, total)

    from ortools.sat.python import cp_model  # loaded only where a model is solved

    model = cp_model.CpModel()
    runs: dict[tuple[int, int], cp_model.IntVar] = {}
    for p in range(num_units):
        for length in range(1, min(max_len, num_units - p) + 1):
            runs[(p, length)] = model.new_bool_var(f"y_{p}_{length}")
    starting: list[list[cp_model.IntVar]] = [[] for _ in range(num_units + 1)]
    ending: list[list[cp_model.IntVar]] = [[] for _ in range(num_units + 1)]
    for (p, length), var in runs.items():
        starting[p].append(var)
        ending[p + length].append(var)
    model.add(sum(starting[0]) == 1)
    model.add(sum(ending[num_units]) == 1)
    for q in range(1, num_units):
        model.add(sum(ending[q]) == sum(starting[q]))
    for length in range(1, max_len + 1):
        bins = sum(1 for c in capacities if c >= length)
        longer = [var for (p, run), var in runs.items() if run >= length]
        if len(longer) > bins:
            model.add(sum(longer) <= bins)
    model.maximize(sum(inner[p][length - 1] * var for (p, length), var in runs.items()))
    hinted = set()
    start = 0
    for length in start_hint:
        hinted.add((start, length))
        start += length
    for key, var in runs.items():
        model.add_hint(var, key in hinted)

    solver = deterministic_solver(time_limit_s)
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # No solution within the budget: keep the structured answer; no bound was proven.
        return Segmentation(start_hint, hint_cut, 0, "HINT", hint_cut, total)
    lengths = []
    p = 0
    while p < num_units:
        length = next(run for run in range(1, max_len + 1)
                      if (p, run) in runs and solver.value(runs[(p, run)]))
        lengths.append(length)
        p += length
    cut = cut_weight_of(lengths, inner, total)
    bound = max(0, total - int(solver.best_objective_bound))
    return Segmentation(tuple(lengths), cut, min(bound, cut), solver.status_name(status),
                        hint_cut, total)


def assign_runs(lengths: Sequence[int], capacities: Sequence[int]) -> list[int]:
    """Bin index of each run: longest runs first, each to the smallest free bin that fits.

    Best fit in decreasing length never strands a later (shorter) run, so it succeeds whenever
    the per-length counting condition of ``segment`` holds. Ties go to the lower bin index and
    runs of equal length keep their order, so bins are used in node order where possible.
    """
    order = sorted(range(len(lengths)), key=lambda r: (-lengths[r], r))
    free = sorted(range(len(capacities)), key=lambda b: (capacities[b], b))
    bin_of = [-1] * len(lengths)
    for run in order:
        pick = next((b for b in free if capacities[b] >= lengths[run]), None)
        if pick is None:
            raise ValueError("runs do not fit the bins")
        free.remove(pick)
        bin_of[run] = pick
    return bin_of
