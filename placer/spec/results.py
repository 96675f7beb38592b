"""Output models: a cost estimate, a rank map, a plan. The JSON schema comes from these."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from placer.dims import PART_GROUP, Group, Part
from placer.spec.base import Output
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model

LinkClass = Literal["local", "nvlink", "pcie", "network"]


class StepBreakdown(Output):
    """Where a step's time goes; the parts add up to the step time."""

    compute_s: float = Field(description="forward + backward GEMMs and attention, no recompute")
    recompute_s: float = Field(description="extra forward work of activation recomputation")
    tp_exposed_s: float = Field(description="TP collectives on the critical path")
    cp_exposed_s: float = Field(description="CP K/V exchange not hidden behind attention")
    ep_exposed_s: float = Field(description="MoE dispatch/combine all-to-alls")
    pp_bubble_s: float = Field(description="pipeline fill and drain")
    pp_p2p_s: float = Field(description="stage-boundary sends on the critical path")
    dp_exposed_s: float = Field(description="gradient reduction not hidden behind backward")
    zero_exposed_s: float = Field(
        description="per-micro-batch ZeRO-2/3 (FSDP) gradient reduce-scatters and ZeRO-3 "
        "parameter gathers not hidden")
    optimizer_s: float = Field(description="optimizer step (memory-bound)")


class MemoryBreakdown(Output):
    """Peak memory of the worst rank (the pipeline stage that needs most)."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int = Field(description="output-layer logits and loss buffers")
    moe_buffers_bytes: int
    framework_bytes: int = Field(description="CUDA context, NCCL buffers, workspaces")
    fragmentation_bytes: int = Field(description="allocator fragmentation allowance")
    overhead_bytes: int = Field(default=0, description="measured live bytes beyond the model's "
                                "tensors (a calibrated profile's memory.overhead_bytes)")
    total_bytes: int
    capacity_bytes: int = Field(description="usable GPU memory after the job's headroom")
    worst_stage: int


class CollectiveCost(Output):
    """One kind of collective a part of the step issues on one group, and its cost per step."""

    dimension: Part = Field(description="the step-breakdown part it is charged to")
    group: Group = Field(description="the rank-map group it runs on (dp_cp: dense gradients and "
                         "ZeRO shards; edp: expert gradients)")
    collective: str
    message_bytes: int
    calls_per_step: int
    group_size: int
    algorithm: str = Field(description="what NCCL would pick: ring, tree, nvls, hierarchical")
    link_class: LinkClass
    bus_bandwidth_bytes_per_s: float
    time_s: float = Field(description="total time of these calls per step, before overlap")
    exposed_s: float = Field(description="the part on the critical path")

    @model_validator(mode="before")
    @classmethod
    def _group_of_older_plans(cls, data: Any) -> Any:
        """Plans written before rows named their group: each part's own group (a replay of an
        expert row then fails on its group size instead of running the wrong group)."""
        if isinstance(data, dict) and "group" not in data and "dimension" in data:
            return {**data, "group": PART_GROUP.get(str(data["dimension"]), data["dimension"])}
        return data


class Estimate(Output):
    """Predicted performance of one layout with one placement (``placer estimate --json``)."""

    layout: Layout
    mesh_order: list[str] = Field(description="rank order, innermost first, e.g. tp-cp-dp-pp")
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float = Field(description="model FLOPs (no recompute) per GPU, in TFLOP/s")
    hardware_tflops_per_gpu: float = Field(description="counting recomputation")
    mfu: float = Field(description="model FLOPs utilisation, 0-1, of the dense peak")
    hfu: float
    peak_memory_bytes: int
    fits: bool
    breakdown: StepBreakdown
    memory: MemoryBreakdown
    collectives: list[CollectiveCost]
    links: dict[str, LinkClass] = Field(description="slowest link each dimension crosses")


class RankEntry(Output):
    """Where one global rank runs and its coordinates in the parallel grid."""

    rank: int
    node: int
    local_rank: int
    gpu: int = Field(description="physical GPU index on the node")
    coords: dict[str, int]


class Candidate(Estimate):
    """A ranked layout with its placement."""

    rank_map: list[RankEntry]
    why: list[str] = Field(default_factory=list, description="plain-language reasons")
    stage_layers: list[int] | None = Field(
        default=None,
        description="transformer layers per pipeline stage when uneven (mixed GPU types: slower "
        "stages get fewer); null means the even split",
    )


class SearchStats(Output):
    layouts_considered: int
    layouts_feasible: int
    solver_status: str
    wall_s: float


class Plan(Output):
    """Everything recommend-layout decided, with its inputs echoed (``placer schema plan``)."""

    format: Literal["placer-plan/1"] = "placer-plan/1"
    placer_version: str
    model: Model
    cluster: Cluster
    job: Job
    num_gpus: int
    defaults_used: list[str] = Field(default_factory=list)
    candidates: list[Candidate]
    explanation: list[str] = Field(default_factory=list)
    search: SearchStats | None = None
