"""A framework file priced on its own framework's stack, when the plan was searched on another.

One plan gives files for every framework (``frameworks.py``), but its figures are those of the
stack it was searched on (``plan.job.stack``): Megatron's fused kernels and ZeRO-1, say. The
same layout as torchtitan runs it (eager PyTorch modules, FSDP2 for ZeRO-1/2, op-level
checkpointing for selective) needs other memory and time. ``off_stack_price`` prices the file's
layout with ``placer.cost.estimate`` on the stack preset its dialect's version maps to, so the
file and the README say whether it fits there, and ``placer launch`` warns when it does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.cost import estimate
from placer.dialects import Target, deepspeed, megatron, megatron_bridge, torchtitan
from placer.dialects.base import pipeline_split, version_key
from placer.launch.rankmap import PlacedCandidate
from placer.spec import Layout
from placer.spec.runtime import Runtime
from placer.spec.stack import load_stack, runtime_problem, stack_names, stack_problem

GIB = 2**30

# Framework file -> the stack framework that runs it (Stack.framework), the stack preset
# package its version is looked up in, and its dialect's target. Megatron-Bridge runs
# Megatron-Core's training loop (megatron_bridge.refusals).
FILE_STACKS: dict[str, tuple[str, str, Target]] = {
    megatron.FILE: ("megatron", "megatron-core", megatron.TARGET),
    megatron_bridge.FILE: ("megatron", "megatron-core", megatron_bridge.TARGET),
    torchtitan.TOML_FILE: ("torchtitan", "torchtitan", torchtitan.TARGET),
    torchtitan.PY_FILE: ("torchtitan", "torchtitan", torchtitan.TARGET),
    deepspeed.FILE: ("deepspeed", "deepspeed", deepspeed.TARGET),
}


@dataclass(frozen=True)
class StackPrice:
    """The layout of one framework file, priced on that framework's stack preset."""

    file: str
    label: str
    """The framework and version the file is written for, ``torchtitan 0.3``."""
    stack: str
    """The stack preset that priced it, ``torchtitan@0.2``."""
    preset_note: str
    """Why that preset (empty when it is the version's own)."""
    searched_on: str
    layout: Layout
    peak_bytes: int
    capacity_bytes: int
    fits: bool | None
    """None: the stack does not run the layout (``not_run`` says why), so it is not priced."""
    step_time_s: float
    base_step_time_s: float
    """The plan's layout on the plan's own stack, priced the same way (``estimate`` at the
    mesh order, the cluster's first GPUs, preset constants), so the two times compare like
    with like (the plan's own figure may come from a calibrated profile or a mixed cluster's
    paced split)."""
    fix: str
    not_run: str = ""

    def lines(self) -> list[str]:
        """The note written in the file and the README."""
        preset = f" ({self.preset_note})" if self.preset_note else ""
        if self.fits is None:
            return [f"Not priced for {self.label}: the plan was searched for {self.searched_on}; "
                    f"{self.stack}{preset} does not run this layout ({self.layout.compact()}): "
                    f"{self.not_run}."]
        verdict = "fits" if self.fits else "does not fit"
        text = (f"Priced for {self.label}: the plan was searched for {self.searched_on}; under "
                f"{self.stack}{preset} this layout, as {self.label} runs it "
                f"({self.layout.compact()}), is predicted at {self.peak_bytes / GIB:.1f} of "
                f"{self.capacity_bytes / GIB:.1f} GiB usable per GPU (after the job's memory "
                f"headroom): {verdict}; {self.step_time_s:.1f} s per step ("
                f"{self.base_step_time_s:.1f} s on {self.searched_on}, priced the same way).")
        if self.fits:
            return [text]
        return [text, f"It would run out of memory: search this job on {self.label}'s stack "
                f"instead, `{self.fix}`, and launch that plan."]

    def warning(self) -> str:
        """One stderr line for ``placer launch`` (only for a file that does not fit)."""
        return (f"{self.file}: the plan was searched for {self.searched_on}; under "
                f"{self.stack} this layout needs {self.peak_bytes / GIB:.1f} of "
                f"{self.capacity_bytes / GIB:.1f} GiB usable per GPU: does not fit; "
                f"run `{self.fix}`")


def stack_for(package: str, version: str) -> tuple[str, str] | None:
    """The stack preset of ``package`` for release series ``version``, and a note when it is
    not that series' own: the series' preset, else the newest one not newer than it, else the
    newest (said so); None when placer has no preset of that package."""
    presets = sorted((n for n in stack_names() if n.partition("@")[0] == package),
                     key=lambda n: version_key(n.partition("@")[2]))
    if not presets:
        return None
    wanted = version_key(version)
    exact = [n for n in presets if version_key(n.partition("@")[2])[:len(wanted)] == wanted]
    if exact:
        return exact[-1], ""
    older = [n for n in presets if version_key(n.partition("@")[2]) < wanted]
    if older:
        return older[-1], f"placer has no {package} {version} preset; its newest before it"
    return presets[-1], f"placer has no {package} {version} preset; its newest"


def written_layout(placement: PlacedCandidate) -> Layout:
    """The candidate's layout with the pipeline split the framework files write
    (``dialects.base.pipeline_split``: the candidate's per-stage counts where the layout
    gives none and they are uneven)."""
    layout = placement.layout
    split = pipeline_split(placement)
    if layout.stage_layers is not None or len(set(split.chunks)) == 1:
        return layout
    return layout.model_copy(update={"stage_layers": tuple(split.chunks)})


def framework_layout(layout: Layout, framework: str) -> Layout:
    """The layout as the framework file makes the framework run it: torchtitan's is its
    dialect's (``torchtitan.runs_as``); Megatron's and DeepSpeed's files run it as written."""
    return torchtitan.runs_as(layout) if framework == "torchtitan" else layout


def _runtime_on(runtime: Runtime, stack: str) -> Runtime:
    """The job's runtime with what ``stack`` does not offer back at its default (the file for
    that framework does not set it: Megatron's files do not compile, say)."""
    defaults = Runtime()
    preset = load_stack(stack)
    while (problem := runtime_problem(runtime, preset)) is not None:
        name = problem[0].removeprefix("runtime.")
        runtime = runtime.model_copy(update={name: getattr(defaults, name)})
    return runtime


def fix_command(placement: PlacedCandidate, stack: str) -> str:
    """``placer recommend-layout`` for the plan's model, cluster and job on ``stack``."""
    plan = placement.plan
    cluster, job = plan.cluster, plan.job
    parts = ["placer recommend-layout", f"--model {plan.model.name}", f"--cluster {cluster.name}"]
    if len(cluster.pools) == 1:
        parts.append(f"--nodes {cluster.pools[0].count}")
    parts += [f"--seq-len {job.seq_len}", f"--global-batch {job.global_batch_size}"]
    if job.precision != "bf16":
        parts.append(f"--precision {job.precision}")
    parts.append(f"--stack {stack}")
    return " ".join(parts)


def off_stack_price(placement: PlacedCandidate, file: str, version: str) -> StackPrice | None:
    """``file``'s layout priced on its framework's stack; None when the plan was searched on a
    stack of that framework (its figures are the file's) or placer has no preset for it."""
    framework, package, target = FILE_STACKS[file]
    plan = placement.plan
    searched = plan.job.stack
    if searched is not None and load_stack(searched).framework == framework:
        return None
    # Bridge's version is its own; the Megatron-Core it runs is Megatron-LM's (refusals)
    chosen = stack_for(package, megatron.TARGET.default if target is megatron_bridge.TARGET
                       else version)
    if chosen is None:
        return None
    stack, preset_note = chosen
    written = written_layout(placement)
    layout = framework_layout(written, framework)
    # the plan's job is valid (placement_of); on the other stack only its runtime may not be
    job = plan.job.model_copy(update={"stack": stack,
                                      "runtime": _runtime_on(plan.job.runtime, stack)})
    head = {"file": file, "label": f"{target.label} {version}", "stack": stack,
            "preset_note": preset_note, "layout": layout,
            "searched_on": searched or "placer's generic defaults",
            "fix": fix_command(placement, stack)}
    # torchtitan's files are judged by its dialect's refusals, as placer check judges them:
    # torchtitan@0.2's layout_fields are what placer searches, narrower than torchtitan (it
    # runs etp = tp); the other stacks' rules are their frameworks' (a DeepSpeed pipeline runs
    # 1F1B without virtual stages)
    problem = None if framework == "torchtitan" else stack_problem(layout, load_stack(stack),
                                                                   plan.model)
    if problem is not None:
        field, value, why = problem
        return StackPrice(**head, peak_bytes=0, capacity_bytes=0, fits=None, step_time_s=0.0,
                          base_step_time_s=0.0, not_run=f"{field} {value}: {why}")
    order = placement.grid.order
    est = estimate(plan.model, plan.cluster, job, layout, order=order)
    base = estimate(plan.model, plan.cluster, plan.job, written, order=order)
    return StackPrice(**head, peak_bytes=est.peak_memory_bytes,
                      capacity_bytes=est.memory.capacity_bytes, fits=est.fits,
                      step_time_s=est.step_time_s, base_step_time_s=base.step_time_s)
