"""Training stack: what one framework version can run, its defaults, and what it refuses.

A stack preset (``placer/spec/presets/stacks/<name>@<version>.yaml``) lists the layout knobs the
framework exposes (``layout_fields``), the values it offers for the searched ones (schedules,
recompute modes, ZeRO stages), the overlaps it implements and which are on by default, its MoE
dispatchers, and rules: combinations it refuses, each with the framework source that refuses
them. ``stack_problem`` is the one check (the solver filters with it, ``estimate`` raises from
it); ``placer.cost.options.options_for`` turns the defaults into the cost model's inputs.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from placer.errors import PlacerError
from placer.spec.base import Spec
from placer.spec.layout import RECOMPUTE_CHOICES, Layout, Recompute, RecomputeModule
from placer.spec.model import Model
from placer.spec.pipeline import Schedule
from placer.spec.runtime import Dispatcher, Fp8Recipe, Overlap, Runtime

CompileComponent = Literal["layers", "loss"]
"""What a stack torch.compiles under runtime.torch_compile: ``layers``, each transformer block
(CostOptions.compiled_layers), and ``loss``, the cross-entropy (CostOptions.compiled_loss)."""

STACK_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,40}@[0-9][0-9A-Za-z.+-]{0,20}$"

LAYOUT_KNOBS = ("cp", "ep", "etp", "vpp", "sequence_parallel", "schedule", "first_stage_layers",
                "last_stage_layers", "embedding_in_split", "loss_in_split", "pp_layout",
                "stage_layers", "recompute_modules", "recompute_layers", "offload_layers",
                "dp_shard", "reshard_after_forward")
"""Layout fields beyond tp/pp/dp/mbs/zero/recompute that a stack may or may not expose; a layout
that sets one its stack lacks is refused. Degrees count as set above 1, flags when on, the rest
when not None (offload_layers: above 0)."""

_OPERATORS: dict[str, Callable[[object, object], bool]] = {
    "<=": operator.le, ">=": operator.ge, "!=": operator.ne, "=": operator.eq,
    "<": operator.lt, ">": operator.gt,
}
_CONDITION_RE = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|!=|=|<|>|\s+in\s+)\s*(.+?)\s*$")
_SUBJECTS: dict[str, Callable[[Layout], int | str]] = {
    "tp": lambda lay: lay.tp, "pp": lambda lay: lay.pp, "dp": lambda lay: lay.dp,
    "cp": lambda lay: lay.cp, "ep": lambda lay: lay.ep, "etp": lambda lay: lay.etp,
    "vpp": lambda lay: lay.vpp, "mbs": lambda lay: lay.micro_batch_size,
    "zero": lambda lay: lay.effective_zero_stage, "recompute": lambda lay: lay.recompute,
    "sp": lambda lay: "on" if lay.sequence_parallel else "off",
    "schedule": lambda lay: lay.pipeline_schedule, "replicas": lambda lay: lay.zero_replicas,
    "offload": lambda lay: lay.offload_layers,
    "reshard": lambda lay: "on" if lay.reshards_after_forward else "off",
}
_MODEL_SUBJECTS: dict[str, Callable[[Model], int | str]] = {
    "bias": lambda model: "on" if model.linear_bias else "off",
}
"""Keys a condition may test on the model instead of the layout (``bias=on``: Model.linear_bias,
Megatron's add_bias_linear)."""


class Condition(Spec):
    """One test on a layout or its model, written like a job constraint: ``zero>=2``,
    ``schedule in zbv``, ``bias=on``."""

    key: str
    op: Literal["<=", ">=", "!=", "=", "<", ">", "in"]
    values: tuple[int | str, ...] = Field(min_length=1)

    @classmethod
    def parse(cls, text: str) -> Condition:
        match = _CONDITION_RE.match(text)
        if not match or match.group(1) not in (*_SUBJECTS, *_MODEL_SUBJECTS):
            raise ValueError(f"condition {text!r} must look like 'zero>=2' or 'schedule in zbv' "
                             f"with a key from {', '.join((*_SUBJECTS, *_MODEL_SUBJECTS))}")
        raw = [v.strip() for v in match.group(3).split(",")]
        values = tuple(int(v) if v.isdigit() else v for v in raw)
        return cls(key=match.group(1), op=match.group(2).strip(), values=values)  # type: ignore[arg-type]

    def holds(self, layout: Layout, model: Model) -> bool:
        subject = (_MODEL_SUBJECTS[self.key](model) if self.key in _MODEL_SUBJECTS
                   else _SUBJECTS[self.key](layout))
        if self.op == "in":
            return subject in self.values
        return bool(_OPERATORS[self.op](subject, self.values[0]))

    def __str__(self) -> str:
        joined = ",".join(str(v) for v in self.values)
        return f"{self.key} in {joined}" if self.op == "in" else f"{self.key}{self.op}{joined}"


def _conditions_or_strings(schema: dict[str, object]) -> None:
    """JSON schema of ``when``: conditions or their text (``"pp>1"``), as preset files write."""
    items = schema["items"]
    schema["items"] = {"anyOf": [items, {"type": "string", "description": "e.g. 'zero>=2'"}]}


def _parse_when(data: object) -> object:
    """``when`` written as strings (``["pp>1", "zero>=2"]``) becomes Conditions."""
    if isinstance(data, dict) and isinstance(data.get("when"), list | tuple | str):
        when = data["when"]
        items = [when] if isinstance(when, str) else when
        data = {**data, "when": tuple(Condition.parse(c) if isinstance(c, str) else c
                                      for c in items)}
    return data


class StackRule(Spec):
    """A combination the framework refuses: every condition of ``when`` holds."""

    id: str = Field(pattern=r"^[a-z0-9-]{1,64}$")
    when: tuple[Condition, ...] = Field(min_length=1, json_schema_extra=_conditions_or_strings)
    why: str = Field(min_length=1, max_length=400)
    source: str = Field(min_length=1, max_length=300, description="repo@commit:path[:line]")

    @model_validator(mode="before")
    @classmethod
    def _conditions(cls, data: object) -> object:
        return _parse_when(data)

    def applies(self, layout: Layout, model: Model) -> bool:
        return all(c.holds(layout, model) for c in self.when)


class StackRequirement(Spec):
    """Flags a launch must carry when ``when`` holds (what the framework asserts otherwise)."""

    id: str = Field(pattern=r"^[a-z0-9-]{1,64}$")
    when: tuple[Condition, ...] = Field(min_length=1, json_schema_extra=_conditions_or_strings)
    flags: str = Field(min_length=1, max_length=300)
    why: str = Field(min_length=1, max_length=400)
    source: str = Field(min_length=1, max_length=300)

    @model_validator(mode="before")
    @classmethod
    def _conditions(cls, data: object) -> object:
        return _parse_when(data)

    def applies(self, layout: Layout, model: Model) -> bool:
        return all(c.holds(layout, model) for c in self.when)


class StackDefaults(Spec):
    """What a job on this stack runs when it does not say, as the framework's recipes set it."""

    overlaps: tuple[Overlap, ...] = ()
    moe_dispatcher: Dispatcher = "alltoall"
    moe_grouped_gemm: bool = True
    grad_reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    fused_kernels: bool = Field(
        default=True, description="Transformer Engine / fused kernels (Megatron); false for "
        "eager PyTorch model code (torchtitan's and Hugging Face's modules)")
    attention_kernel: Literal["cudnn", "fa2"] = Field(
        default="cudnn", description="fused attention: Transformer Engine's cuDNN kernels (or "
        "FlashAttention-3), or FlashAttention-2 as PyTorch's SDPA flash backend runs it")
    source: str = Field(min_length=1, max_length=600)


class Stack(Spec):
    """One framework version: its knobs, defaults and refusals (see the module docstring)."""

    name: str = Field(pattern=STACK_NAME_PATTERN, description="<framework>@<version>")
    framework: Literal["megatron", "torchtitan", "deepspeed", "fsdp2"]
    source: str = Field(min_length=1, max_length=300, description="repository@commit read")
    layout_fields: tuple[str, ...] = ()
    schedules: tuple[Schedule, ...] = Field(min_length=1)
    recompute: tuple[Recompute, ...] = Field(min_length=1)
    recompute_modules: tuple[RecomputeModule, ...] = ()
    zero_stages: tuple[int, ...] = Field(min_length=1)
    overlaps: tuple[Overlap, ...] = ()
    moe_dispatchers: tuple[Dispatcher, ...] = ()
    fp8_recipes: tuple[Fp8Recipe, ...] = ()
    fp8_param_gather: bool = False
    compile_components: tuple[CompileComponent, ...] = Field(
        default=(), description="what torch.compile compiles when a job sets runtime."
        "torch_compile: layers (each transformer block) and loss; empty: nothing placer models "
        "(Megatron-Core compiles no layers; the job's torch_compile is refused)")
    defaults: StackDefaults
    rules: tuple[StackRule, ...] = ()
    requirements: tuple[StackRequirement, ...] = ()
    dp_overlap_under_pp: bool = Field(
        default=True, description="gradient reduction overlaps the backward under pipelining "
        "(DeepSpeed's pipeline engine reduces after the last micro-batch: false)")
    notes: str = Field(default="", max_length=2000)

    def rule(self, rule_id: str) -> StackRule:
        """The rule of that id (a dialect that enforces it at launch looks it up here)."""
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise KeyError(f"{self.name} has no stack rule {rule_id!r}")

    @model_validator(mode="after")
    def _consistent(self) -> Stack:
        unknown = [f for f in self.layout_fields if f not in LAYOUT_KNOBS]
        if unknown:
            raise ValueError(f"unknown layout_fields {unknown}; known: {', '.join(LAYOUT_KNOBS)}")
        if any(z not in (0, 1, 2, 3) for z in self.zero_stages):
            raise ValueError("zero_stages are 0 to 3")
        missing = [o for o in self.defaults.overlaps if o not in self.overlaps]
        if missing:
            raise ValueError(f"defaults.overlaps {missing} are not in overlaps")
        if self.moe_dispatchers and self.defaults.moe_dispatcher not in self.moe_dispatchers:
            raise ValueError("defaults.moe_dispatcher is not one of moe_dispatchers")
        if any(r not in RECOMPUTE_CHOICES for r in self.recompute):
            raise ValueError("unknown recompute mode")
        return self


def _knob_set(layout: Layout, field: str) -> bool:
    value = getattr(layout, field)
    if field in ("cp", "ep", "etp", "vpp"):
        return bool(value > 1)
    if field == "offload_layers":
        return bool(value > 0)
    if field in ("sequence_parallel", "embedding_in_split", "loss_in_split"):
        return bool(value)
    return value is not None


def stack_problem(layout: Layout, stack: Stack, model: Model) -> tuple[str, object, str] | None:
    """The first reason ``stack`` cannot run ``layout`` of ``model``, naming the stack rule; None
    if it can."""
    for field in LAYOUT_KNOBS:
        if field not in stack.layout_fields and _knob_set(layout, field):
            return (f"layout.{field}", getattr(layout, field),
                    f"{stack.name} has no such knob (stack.layout_fields; {stack.source})")
    checks: tuple[tuple[str, object, tuple[object, ...]], ...] = (
        ("schedule", layout.pipeline_schedule, stack.schedules),
        ("recompute", layout.recompute, stack.recompute),
        ("zero_stage", layout.effective_zero_stage, stack.zero_stages),
    )
    names = {"schedule": "schedules", "recompute": "recompute", "zero_stage": "zero_stages"}
    for field, value, offered in checks:
        if value not in offered and not (field == "schedule" and layout.pp == 1):
            return (f"layout.{field}", value, f"{stack.name} offers "
                    f"{', '.join(map(str, offered))} (stack.{names[field]}; {stack.source})")
    for module in layout.recompute_modules or ():
        if module not in stack.recompute_modules:
            return ("layout.recompute_modules", module, f"{stack.name} recomputes "
                    f"{', '.join(stack.recompute_modules) or 'no modules'}")
    for rule in stack.rules:
        if rule.applies(layout, model):
            return (f"stack rule {rule.id}", layout.compact(), f"{rule.why} ({rule.source})")
    return None


@cache
def _stack_files() -> dict[str, str]:
    folder = resources.files("placer.spec").joinpath("presets", "stacks")
    return {p.name.removesuffix(".yaml"): p.read_text(encoding="utf-8")
            for p in sorted(folder.iterdir(), key=lambda p: p.name) if p.name.endswith(".yaml")}


def stack_names() -> list[str]:
    """Preset stacks, ``<framework>@<version>``."""
    return list(_stack_files())


@cache
def load_stack(ref: str) -> Stack:
    """A preset (``megatron-core@0.20``, or ``megatron-core`` for its newest preset) or a file
    (cached: the solver asks once per layout)."""
    from placer.spec.presets import (
        load_preset_yaml,
        preset_name,
        read_document,
        unknown_preset,
        validated,
    )

    names = stack_names()
    ref = preset_name(ref, names) or ref
    if ref not in names:
        versions = sorted((n for n in names if n.partition("@")[0] == ref.casefold()),
                          key=lambda n: tuple(int(p) for p in n.partition("@")[2].split(".")
                                              if p.isdigit()))
        if versions:
            ref = versions[-1]
    if ref in names:
        return validated(Stack, load_preset_yaml(_stack_files()[ref]), f"stack {ref}")
    path = Path(ref)
    if path.suffix.lower() not in (".yaml", ".yml", ".json") or not path.exists():
        raise unknown_preset("--stack", ref, names)
    data = read_document(path)
    if not isinstance(data, dict):
        raise PlacerError(f"{path}: expected a mapping of stack fields")
    return validated(Stack, data, str(path))


def runtime_problem(runtime: Runtime, stack: Stack) -> tuple[str, object, str] | None:
    """The first runtime setting ``stack`` does not offer (an overlap, a dispatcher, an FP8
    recipe, FP8 parameter gather, torch.compile), or None."""
    for overlap in runtime.overlaps or ():
        if overlap not in stack.overlaps:
            return ("runtime.overlaps", overlap, f"{stack.name} overlaps "
                    f"{', '.join(stack.overlaps) or 'nothing'} (stack.overlaps)")
    if runtime.moe_dispatcher is not None and runtime.moe_dispatcher not in stack.moe_dispatchers:
        return ("runtime.moe_dispatcher", runtime.moe_dispatcher, f"{stack.name} dispatches "
                f"with {', '.join(stack.moe_dispatchers) or 'no MoE dispatcher'}")
    if runtime.fp8_recipe is not None and runtime.fp8_recipe not in stack.fp8_recipes:
        return ("runtime.fp8_recipe", runtime.fp8_recipe, f"{stack.name} offers "
                f"{', '.join(stack.fp8_recipes) or 'no FP8 recipe'}")
    if runtime.fp8_param_gather and not stack.fp8_param_gather:
        return ("runtime.fp8_param_gather", True, f"{stack.name} gathers parameters in bf16")
    if runtime.torch_compile and not stack.compile_components:
        return ("runtime.torch_compile", True, f"{stack.name} lists nothing it torch.compiles "
                "(stack.compile_components): drop --torch-compile (runtime."
                "torch_compile) or use a stack that compiles, e.g. --stack torchtitan@0.2")
    return None
