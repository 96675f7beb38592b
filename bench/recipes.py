"""placer against published vendor recipes: would an expert launch placer's #1 over the recipe?

For every recipe in placer/spec/presets/recipes/*.yaml (NVIDIA NeMo and Megatron-Bridge
performance tables, torchtitan's benchmarks, the Llama 3 paper; each row cites its source):

- expressible: the published layout passes placer's layout rules for that job;
- fits the GPU: the predicted peak as the recipe ran (its launcher's allocator setting: the
  fragmentation allowance unless it set expandable segments; CUDA context and NCCL buffers
  included) is within the whole GPU, as bench/accuracy.py judges a run that ran (``as_ran``): a
  published recipe ran, so this is a statement about the memory model;
- fits with headroom: the layout as placer would plan and launch it (the recipe's framework
  flags, the allocator as placer's env.sh sets it: expandable segments, no fragmentation
  allowance) within the GPU less the default planning headroom, the margin placer keeps for its
  own picks (shown, not checked: a recipe owes placer no headroom);
- error: predicted vs measured throughput per GPU (tokens/s where the source gives it, else
  model TFLOP/s or MFU);
- rank: the recipe's place among placer's top ``--top`` candidates by predicted step time;
- #1 gain: placer's #1 predicted throughput over the recipe's, and whether the model can tell
  them apart (its measured error, ``placer.cost.validity.MODEL_ERROR``).

Then the issue-16 checks: every recipe expressible and predicted to fit the GPU; no #1 predicted
more than 10 % faster than its recipe without a note; no #1 with CP > 2 at <= 8K tokens unless it
beats the recipe by more than the measured error; every #1 keeps the default headroom; the launch
dialect of the recipe's stack writes #1's files (``placer.launch.launch_bundle`` refuses none).

    .venv/bin/python bench/recipes.py [--top 10] [--max-gpus 1024] [--only ID] [--emit DIR]
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import _grand_teton, as_ran  # noqa: E402  (bench helpers: Grand Teton nodes; fit)

from placer.cost import estimate  # noqa: E402
from placer.cost.memory import capacity_bytes, memory_estimate  # noqa: E402
from placer.cost.profile import bounding_node_type  # noqa: E402
from placer.cost.validity import (  # noqa: E402
    MODEL_ERROR,
    beyond_measured_mfu,
    unvalidated_mechanisms,
)
from placer.errors import PlacerError  # noqa: E402
from placer.io import write_text  # noqa: E402
from placer.launch import launch_bundle  # noqa: E402
from placer.mesh import DEFAULT_ORDER  # noqa: E402
from placer.report.describe import BREAKDOWN_LABELS, same_shape  # noqa: E402
from placer.report.plan import build_plan, plan_json  # noqa: E402
from placer.solver import recommend  # noqa: E402
from placer.solver.select import KNOB_TOLERANCE  # noqa: E402
from placer.spec.cluster import Cluster  # noqa: E402
from placer.spec.job import DEFAULT_MEMORY_HEADROOM, Job  # noqa: E402
from placer.spec.layout import Layout, layout_problem  # noqa: E402
from placer.spec.model import Model  # noqa: E402
from placer.spec.presets import cluster_preset, model_preset  # noqa: E402
from placer.spec.recipe import Recipe, published_recipes  # noqa: E402
from placer.spec.results import Candidate, Estimate  # noqa: E402
from placer.spec.stack import load_stack, stack_names, stack_problem  # noqa: E402
from placer.units import gib, gib_text  # noqa: E402

GAIN_LIMIT = 0.10  # issue 16: #1 never predicted more than 10 % faster than a published recipe
SHORT_SEQ = 8192  # issue 16: no #1 with CP > 2 at sequences <= 8K unless beyond the error


def cluster_for(recipe: Recipe) -> Cluster:
    """The recipe's machines: a cluster preset scaled to its GPUs, or torchtitan's Grand Teton."""
    if recipe.cluster == "grand-teton":
        return _grand_teton(-(-recipe.num_gpus // 8))
    base = cluster_preset(recipe.cluster)
    per_node = base.num_gpus // base.num_nodes
    return base.with_nodes(-(-recipe.num_gpus // per_node))


def measured_error(recipe: Recipe, est: Estimate) -> tuple[float, str]:
    """Predicted / measured - 1 on the figure the source reports, and that figure's name."""
    got = recipe.measured
    if got.tokens_per_s_per_gpu is not None:
        return est.tokens_per_s / recipe.num_gpus / got.tokens_per_s_per_gpu - 1.0, "tok/s"
    if got.mfu is not None:
        return est.mfu / got.mfu - 1.0, "MFU"
    if got.model_tflops_per_gpu is not None:
        return est.tflops_per_gpu / got.model_tflops_per_gpu - 1.0, "TFLOP/s"
    raise ValueError(f"{recipe.id}: no measured throughput")


@dataclass(frozen=True)
class Outcome:
    recipe: Recipe
    expressible: str  # "yes" or the rule it breaks
    fits: bool  # the predicted peak within the whole GPU (as_ran)
    fits_headroom: bool  # ... and within the GPU less the job's default planning headroom
    error: float | None
    figure: str
    rank: str
    best: Estimate | None
    gain: float | None
    wall_s: float
    notes: tuple[str, ...]
    refusals: tuple[str, ...] = ()
    memory: tuple[int, int] = (0, 0)  # the recipe's predicted peak and the whole GPU, bytes
    default_capacity: int = 0  # the GPU less the default planning headroom, bytes
    stack_rule: str = ""  # the stack rule #1 breaks ("" if none, or no stack preset)

    @property
    def checks(self) -> list[str]:
        """The issue-16 conditions this row breaks (empty: all met)."""
        broken = []
        if self.expressible != "yes":
            broken.append("not expressible")
        if not self.fits:
            broken.append(f"not predicted to fit the GPU (peak {gib(self.memory[0])} of "
                          f"{gib_text(self.memory[1])})")
        best = self.best
        if best is None or self.gain is None:
            return [*broken, "no #1"]
        if self.gain > GAIN_LIMIT and not self.notes:
            broken.append(f"#1 {self.gain:+.1%} over the recipe, unexplained")
        if (best.layout.cp > 2 and self.recipe.seq_len <= SHORT_SEQ
                and self.gain <= MODEL_ERROR):
            broken.append("#1 uses CP > 2 at <= 8K within the model's error")
        if best.memory.total_bytes > self.default_capacity:
            broken.append(f"#1 eats into the default {DEFAULT_MEMORY_HEADROOM:.0%} headroom "
                          f"({gib(best.memory.total_bytes)} of {gib_text(self.default_capacity)})")
        if self.stack_rule:
            broken.append(f"#1 breaks its stack's rule: {self.stack_rule}")
        broken += [f"#1's launch file refused: {line}" for line in self.refusals]
        return broken


STACK_TARGET = {"megatron-core": "megatron", "torchtitan": "torchtitan"}
"""The launch dialect (placer.dialects) of each recipe stack that has one."""


def launch_refusals(recipe: Recipe, best: Candidate, emit: Path | None) -> list[str]:
    """Why the stack's own launch files for #1 cannot be written (empty: they can), and
    ``EMIT/<recipe id>/plan.json`` for ``placer launch`` and the framework acceptance harness
    (tests/helpers_frameworks.py runs the frameworks' validators on plan files)."""
    plan = build_plan(model_preset(recipe.model), cluster_for(recipe), placer_job(recipe), [best])
    if emit is not None:
        (emit / recipe.id).mkdir(parents=True, exist_ok=True)
        write_text(emit / recipe.id / "plan.json", plan_json(plan), "--emit")
    try:
        _, refused = launch_bundle(plan, 0)
    except PlacerError as exc:
        return [str(exc)]
    target = STACK_TARGET.get(recipe.stack)
    return [r.line() for r in refused if r.target.name == target]


def _job(recipe: Recipe) -> Job:
    """The job as the recipe's source ran it (its framework flags and its launcher's allocator)."""
    stack = recipe.stack if recipe.stack in {n.split("@")[0] for n in stack_names()} else None
    return Job(name="recipe", seq_len=recipe.seq_len, global_batch_size=recipe.global_batch_size,
               precision=recipe.precision, stack=stack, runtime=recipe.runtime)


def placer_job(recipe: Recipe) -> Job:
    """The job as placer plans and launches it: the recipe's framework flags, the allocator as
    placer's env.sh sets it (``runtime.expandable_segments`` unset: spec/runtime.py)."""
    job = _job(recipe)
    runtime = job.runtime.model_copy(update={"expandable_segments": None})
    return job.model_copy(update={"runtime": runtime})


def evaluate(recipe: Recipe, top: int, emit: Path | None = None) -> Outcome:
    model = model_preset(recipe.model)
    cluster = cluster_for(recipe)
    job = _job(recipe)
    layout = recipe.parsed_layout()
    started = time.perf_counter()
    problem = layout_problem(layout, model, job, recipe.num_gpus)
    expressible = "yes" if problem is None else f"{problem[0]}={problem[1]}: {problem[2]}"
    if problem is not None:
        return Outcome(recipe, expressible, False, False, None, "", "-", None, None, 0.0, ())
    est = estimate(model, cluster, as_ran(job), layout, order=DEFAULT_ORDER)
    planned = placer_job(recipe)
    fits_headroom = (memory_estimate(model, cluster, planned, layout).total_bytes
                     <= capacity_bytes(cluster, planned))
    memory = (est.memory.total_bytes, est.memory.capacity_bytes)
    error, figure = measured_error(recipe, est)
    try:
        found = recommend(model, cluster, planned, top_k=top).candidates
    except PlacerError as exc:
        return Outcome(recipe, expressible, est.fits, fits_headroom, error, figure,
                       f"none ({exc})", None, None, time.perf_counter() - started, (),
                       memory=memory)
    # Its rank: one more than the distinct candidates predicted faster than it (beyond the
    # solver's knob tolerance, within which it would be one of them).
    faster = sum(c.step_time_s < est.step_time_s * (1 - KNOB_TOLERANCE) for c in found)
    rank = str(faster + 1) if faster < len(found) else f">{len(found)}"
    if any(same_shape(c.layout, layout) for c in found[:1]):
        rank = "1"
    best = found[0]
    refusals = tuple(launch_refusals(recipe, best, emit))
    default = capacity_bytes(cluster, planned.model_copy(
        update={"memory_headroom": DEFAULT_MEMORY_HEADROOM}))
    problem = (stack_problem(best.layout, load_stack(planned.stack), model) if planned.stack
               else None)
    rule = f"{problem[0]}={problem[1]}: {problem[2]}" if problem else ""
    gain = est.step_time_s / best.step_time_s - 1.0
    notes = tuple(line for line in best.why if line.startswith("unvalidated"))
    node = bounding_node_type(cluster)
    unmeasured = beyond_measured_mfu(best.mfu, node.gpu.name, recipe.precision,
                                     best.layout.num_gpus > node.gpus_per_node)
    if unmeasured:
        notes = (*notes, f"unvalidated: {unmeasured}")
    if gain > GAIN_LIMIT:
        notes = (*notes, _mechanism(best, est), _alone(model, cluster, planned, layout,
                                                       best.layout))
    return Outcome(recipe, expressible, est.fits, fits_headroom, error, figure, rank, best,
                   gain, time.perf_counter() - started, notes, refusals, memory, default, rule)


KNOBS = (("tp", "TP"), ("pp", "PP"), ("dp", "DP"), ("cp", "CP"), ("ep", "EP"), ("vpp", "VPP"),
         ("micro_batch_size", "mbs"), ("zero_stage", "ZeRO"), ("recompute", "recompute"),
         ("sequence_parallel", "SP"))
"""The layout knobs a mechanism line names when #1 changes them."""


def _mechanism(best: Estimate, recipe: Estimate) -> str:
    """The note a gain over 10 % needs: the knobs #1 changes and the step-time parts that make
    it faster, each as the recipe's seconds -> #1's (the parts add up to the step)."""
    changed = [f"{name} {getattr(recipe.layout, f)}->{getattr(best.layout, f)}"
               for f, name in KNOBS if getattr(recipe.layout, f) != getattr(best.layout, f)]
    parts = [(getattr(recipe.breakdown, f) - getattr(best.breakdown, f), f)
             for f in type(best.breakdown).model_fields]
    saved = sorted((d, f) for d, f in parts if d > 0)[::-1][:2]
    moved = ", ".join(f"{BREAKDOWN_LABELS[f]} {getattr(recipe.breakdown, f):.2f} -> "
                      f"{getattr(best.breakdown, f):.2f} s" for _, f in saved)
    return (f"mechanism: {', '.join(changed) or 'placement only'}: {moved} "
            f"(step {recipe.step_time_s:.2f} -> {best.step_time_s:.2f} s)")


ALONE = (("micro_batch_size",), ("recompute", "recompute_modules"), ("zero_stage",), ("tp",),
         ("pp", "vpp"), ("cp",), ("ep",))
"""The knob groups ``_alone`` moves one at a time (dp follows the GPU count)."""


def _alone(model: Model, cluster: Cluster, job: Job, recipe: Layout, best: Layout) -> str:
    """What each knob #1 changes is worth on its own: the recipe with only that knob (group) set
    as #1 has it, dp following the GPU count, its predicted gain over the recipe; a knob that
    gives no valid layout alone is left out."""
    base = estimate(model, cluster, job, recipe, order=DEFAULT_ORDER)
    parts = []
    for group in ALONE:
        if all(getattr(recipe, f) == getattr(best, f) for f in group):
            continue
        update = {f: getattr(best, f) for f in group}
        if "pp" in update and update["pp"] == 1:
            update["vpp"] = 1
        trial = recipe.model_copy(update=update)
        grid = trial.tp * trial.pp * trial.cp
        if recipe.num_gpus % grid:
            continue
        trial = trial.model_copy(update={"dp": recipe.num_gpus // grid})
        if layout_problem(trial, model, job, recipe.num_gpus) is not None:
            continue
        est = estimate(model, cluster, job, trial, order=DEFAULT_ORDER)
        names = dict(KNOBS)
        moved = " ".join(f"{names[f]} {getattr(recipe, f)}->{getattr(best, f)}" for f in group
                         if f in names and getattr(recipe, f) != getattr(best, f))
        fit = "" if est.memory.total_bytes <= est.memory.capacity_bytes else ", does not fit"
        parts.append(f"{moved} {base.step_time_s / est.step_time_s - 1:+.1%}{fit}")
    return "each alone: " + ("; ".join(parts) if parts else "no single knob gives a valid layout")


def _short(layout_text: str) -> str:
    keep = ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero", "recompute")
    parts = dict(p.split("=", 1) for p in layout_text.split(","))
    return " ".join(f"{k}{parts[k]}" for k in keep if k in parts
                    and parts[k] not in ("1", "none", "0") or k in ("tp", "pp", "dp"))


def report(outcomes: list[Outcome]) -> int:
    header = (f"{'recipe':<40} {'expr':<4} {'fits':>4} {'fits':>8} {'error':>7} {'rank':>5} "
              f"{'#1 gain':>8}  #1 layout")
    print(f"{'':<45} {'GPU':>4} {'headroom':>8}")
    print(header)
    print("-" * len(header))
    broken = 0
    for o in outcomes:
        err = f"{o.error:+.1%}" if o.error is not None else "-"
        gain = f"{o.gain:+.1%}" if o.gain is not None else "-"
        tie = " tie" if o.gain is not None and o.gain < MODEL_ERROR else ""
        best = _short(o.best.layout.compact()) if o.best is not None else "-"
        print(f"{o.recipe.id:<40} {'yes' if o.expressible == 'yes' else 'NO':<4} "
              f"{'yes' if o.fits else 'NO':>4} {'yes' if o.fits_headroom else 'no':>8} "
              f"{err:>7} {o.rank:>5} {gain:>8}{tie:<4} {best}")
        for note in o.notes:
            for line in textwrap.wrap(note, 108, subsequent_indent="  "):
                print(f"{'':<42}{line}")
        for check in o.checks:
            broken += 1
            print(f"{'':<42}FAILS: {check}")
        if o.expressible != "yes":
            print(f"{'':<42}{o.expressible}")
    errors = [abs(o.error) for o in outcomes if o.error is not None]
    gains = [o.gain for o in outcomes if o.gain is not None]
    print()
    print(f"{len(outcomes)} recipes; expressible {sum(o.expressible == 'yes' for o in outcomes)}"
          f", predicted to fit the GPU {sum(o.fits for o in outcomes)} (with the "
          f"{DEFAULT_MEMORY_HEADROOM:.0%} planning headroom "
          f"{sum(o.fits_headroom for o in outcomes)}); recipe in placer's top 5: "
          f"{sum(o.rank.isdigit() and int(o.rank) <= 5 for o in outcomes)}")
    if errors:
        print(f"estimate error on the recipes: mean {sum(errors) / len(errors):.1%}, max "
              f"{max(errors):.1%} (the model's measured error used for ties: {MODEL_ERROR:.1%})")
    if gains:
        ties = sum(g < MODEL_ERROR for g in gains)
        print(f"#1 over the recipe: median {sorted(gains)[len(gains) // 2]:+.1%}, max "
              f"{max(gains):+.1%}; {ties} of {len(gains)} within the model's error (ties)")
    beyond = sum(any(n.startswith("unvalidated: ") and "MFU predicted" in n for n in o.notes)
                 for o in outcomes)
    print(f"#1 predicted above the best MFU measured on its GPU, precision and node span "
          f"(placer.cost.validity.MEASURED_MFU_CEILING): {beyond} of {len(gains)}")
    print(f"issue-16 checks broken: {broken}")
    return 1 if broken else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="candidates to rank (default 10)")
    parser.add_argument("--max-gpus", type=int, default=1 << 20,
                        help="skip recipes on more GPUs (their searches are the slowest)")
    parser.add_argument("--only", action="append", default=[], metavar="ID",
                        help="evaluate only these recipe ids")
    parser.add_argument("--emit", type=Path, metavar="DIR",
                        help="write DIR/<recipe id>/plan.json with each #1 (for placer launch "
                             "and the framework acceptance harness)")
    args = parser.parse_args(argv)
    outcomes = []
    for recipe in published_recipes():
        if args.only and recipe.id not in args.only:
            continue
        if recipe.num_gpus > args.max_gpus:
            print(f"skipped {recipe.id}: {recipe.num_gpus} GPUs > --max-gpus", file=sys.stderr)
            continue
        outcome = evaluate(recipe, args.top, args.emit)
        print(f"{recipe.id}: {outcome.wall_s:.1f} s", file=sys.stderr)
        outcomes.append(outcome)
    checked = [o for o in outcomes if unvalidated_mechanisms(o.recipe.parsed_layout(),
                                                             Job(seq_len=o.recipe.seq_len,
                                                                 global_batch_size=1))]
    for o in checked:
        print(f"note: the published {o.recipe.id} itself uses an unvalidated mechanism",
              file=sys.stderr)
    return report(outcomes)


if __name__ == "__main__":
    sys.exit(main())
