"""Training job: sequence length, batch, precision, optimizer, and the user's degree constraints."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from placer.errors import InputError
from placer.spec.base import Spec
from placer.spec.runtime import Runtime, runtime_optimizer_bytes
from placer.spec.text import decimal

JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"

CONSTRAINT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp")
RECOMPUTE_MODES = ("none", "selective", "op", "full")
_OPERATORS: dict[str, Callable[[object, object], bool]] = {
    "<=": operator.le, ">=": operator.ge, "!=": operator.ne, "==": operator.eq,
    "=": operator.eq, "<": operator.lt, ">": operator.gt,
}
DEFAULT_MEMORY_HEADROOM = 0.10
"""GPU memory a plan leaves free beyond its predicted peak (which already counts fragmentation,
CUDA context and NCCL buffers): 8 GB of an 80 GB part. Tuned production recipes keep at least
that: torchtitan's published Llama 3 runs on 96 GB H100s peak at 82.4-84.9 GiB of 95.6 GiB,
11-14 % free (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1-6; in
bench/data/published-runs.json). Megatron-Bridge's memory-tuning guide names what estimators
leave out (CUDA graph buffers, token imbalance, dispatcher workspace). ``--memory-headroom GIB``
sets it."""
_CONSTRAINT_RE = re.compile(r"^\s*([a-z]+)\s*(<=|>=|!=|==|=|<|>|\s+in\s+)\s*(.+?)\s*$")


OPTIMIZER_STATE_BYTES = {
    "adam": 8,  # fp32 first and second moments (Kingma & Ba 2015; Megatron's optimizer)
    "adamw": 8,  # Adam's two moments, decoupled weight decay (Loshchilov & Hutter 2019)
    "lion": 4,  # one fp32 momentum (Chen et al. 2023, arXiv:2302.06675, section 2)
    "muon": 4,  # one fp32 momentum (Jordan et al. 2024; Kimi K2's MuonClip, arXiv:2507.20534)
    "sgd": 4,  # one fp32 momentum buffer (torch.optim.SGD with momentum)
    "adafactor": 0,  # factored second moment, O(rows + columns), no first moment (Shazeer &
    #                  Stern 2018, arXiv:1804.04235): negligible per parameter
}
"""fp32 optimizer-state bytes per parameter of the optimizers ``--optimizer`` names."""


class Optimizer(Spec):
    """Bytes each parameter costs in training state (Megatron's bf16 recipe by default)."""

    name: str = Field(default="adam", pattern=r"^[A-Za-z0-9_-]{1,32}$")
    param_bytes: int = Field(default=2, ge=1, le=8, description="working weights (bf16)")
    grad_bytes: int = Field(default=4, ge=1, le=8, description="main gradients (fp32 in Megatron)")
    master_param_bytes: int = Field(default=4, ge=0, le=8, description="fp32 master copy")
    state_bytes: int = Field(default=8, ge=0, le=32, description="Adam moments, fp32 m and v")

    @classmethod
    def named(cls, name: str) -> Optimizer:
        """A known optimizer with Megatron's bf16 weights, fp32 gradients and master copy."""
        return cls(name=name, state_bytes=OPTIMIZER_STATE_BYTES[name])

    @property
    def sharded_state_bytes(self) -> int:
        """What ZeRO-1 shards: master weights plus optimizer moments (12 for Adam)."""
        return self.master_param_bytes + self.state_bytes


class DegreeConstraint(Spec):
    """One user constraint such as ``tp<=8``, ``pp in 1,2,4``, ``zero>=1``, ``recompute=full``."""

    key: Literal["tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp"]
    op: Literal["<=", ">=", "!=", "=", "<", ">", "in"]
    values: tuple[int | str, ...] = Field(min_length=1)

    @classmethod
    def parse(cls, text: str) -> DegreeConstraint:
        """Parse the command-line form; raises ValueError with the valid forms."""
        match = _CONSTRAINT_RE.match(text)
        if not match or match.group(1) not in CONSTRAINT_KEYS:
            raise ValueError(
                f"constraint {text!r} must look like 'tp<=8', 'pp in 1,2,4', 'zero>=1' or "
                f"'recompute=full' with a key from {', '.join(CONSTRAINT_KEYS)}"
            )
        key, op, raw = match.group(1), match.group(2).strip(), match.group(3)
        op = "=" if op == "==" else op
        values = tuple(_constraint_value(key, v.strip()) for v in raw.split(","))
        if op != "in" and len(values) != 1:
            raise ValueError(f"constraint {text!r}: use 'in' for a list of values")
        if key in ("recompute", "sp") and op not in ("=", "!=", "in"):
            raise ValueError(f"constraint {text!r}: {key} takes =, != or in")
        return cls(key=key, op=op, values=values)  # type: ignore[arg-type]

    def allows(self, value: int | str) -> bool:
        if self.op == "in":
            return value in self.values
        return bool(_OPERATORS[self.op](value, self.values[0]))

    def __str__(self) -> str:
        joined = ",".join(str(v) for v in self.values)
        return f"{self.key} in {joined}" if self.op == "in" else f"{self.key}{self.op}{joined}"


def _constraint_value(key: str, raw: str) -> int | str:
    if key == "recompute":
        if raw not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, not {raw!r}")
        return raw
    if key == "sp":
        if raw not in ("on", "off"):
            raise ValueError(f"sp must be on or off, not {raw!r}")
        return raw
    value = decimal(raw)
    if value is None:
        raise ValueError(f"{key} takes a non-negative integer, not {raw!r}")
    return value


def _constraints_or_strings(schema: dict[str, Any]) -> None:
    """JSON schema of ``Job.constraints``: objects or the command-line strings, or one string."""
    text = {"type": "string", "description": "e.g. 'tp<=8', 'pp in 1,2,4', 'zero>=1'"}
    schema["items"] = {"anyOf": [schema["items"], text]}
    as_list = {key: schema.pop(key) for key in ("type", "items")}
    schema["anyOf"] = [as_list, text]


class Job(Spec):
    """One training job on one cluster."""

    name: str = Field(default="placer-job", pattern=JOB_NAME_PATTERN)
    seq_len: int = Field(ge=1, le=100_000_000)
    global_batch_size: int = Field(ge=1, le=100_000_000, description="sequences per step")
    precision: Literal["bf16", "fp8"] = "bf16"
    optimizer: Optimizer = Field(default_factory=Optimizer)
    constraints: tuple[DegreeConstraint, ...] = Field(
        default=(), json_schema_extra=_constraints_or_strings
    )
    memory_headroom: float = Field(
        default=DEFAULT_MEMORY_HEADROOM, ge=0.0, lt=0.9,
        description="fraction of GPU memory kept free beyond what the memory model predicts "
        "(--memory-headroom sets it in GiB)",
    )
    allow_tp_outside_nvlink: bool = Field(
        default=False, description="let TP groups leave an NVLink domain (slow; off by default)"
    )
    runtime: Runtime = Field(
        default_factory=Runtime, description="overlaps, MoE dispatch and precision recipe; unset "
        "fields take the stack's defaults")
    stack: str | None = Field(
        default=None, min_length=1, max_length=400,
        description="training stack preset (megatron-core@0.20, torchtitan@0.2, deepspeed@0.19, "
        "nemo-automodel@0.5; see 'placer presets') or stack file: the layouts it can run and its "
        "defaults")

    @field_validator("stack")
    @classmethod
    def _known_stack(cls, value: str | None) -> str | None:
        """The stack must load (a preset name or file); stored as given."""
        if value is not None:
            from placer.spec.stack import load_stack

            load_stack(value)
        return value

    @model_validator(mode="after")
    def _runtime_on_stack(self) -> Job:
        """Runtime settings must be ones the stack offers (placer.spec.stack.runtime_problem)."""
        if self.stack is not None:
            from placer.spec.stack import load_stack, runtime_problem

            problem = runtime_problem(self.runtime, load_stack(self.stack))
            if problem is not None:
                raise InputError(*problem)
        return self

    @model_validator(mode="before")
    @classmethod
    def _runtime_bytes(cls, data: Any) -> Any:
        """bf16 gradient reduction keeps 2-byte main gradients; FP8 parameter gather keeps
        1-byte weights (Megatron --grad-reduce-in-bf16, --fp8-param-gather): the optimizer's
        byte counts follow unless the job gives them."""
        return runtime_optimizer_bytes(data)

    @field_validator("constraints", mode="before")
    @classmethod
    def _parse_constraints(cls, value: object) -> object:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list | tuple):
            return tuple(DegreeConstraint.parse(v) if isinstance(v, str) else v for v in value)
        return value

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size
