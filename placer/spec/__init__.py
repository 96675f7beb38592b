"""Input and output models (pydantic): the single source of truth for every file placer reads
or writes."""

from placer.spec.cluster import NIC, Cluster, GpuRef, IntraNodeFabric, NetworkFabric, NodeType
from placer.spec.gpu import GPU
from placer.spec.job import DegreeConstraint, Job, Optimizer
from placer.spec.layout import Layout, layout_problem, pipeline_stage_layers, validate_layout
from placer.spec.model import Model, MoE
from placer.spec.results import (
    Candidate,
    CollectiveCost,
    Estimate,
    MemoryBreakdown,
    Plan,
    RankEntry,
    StepBreakdown,
)

__all__ = [
    "GPU", "NIC", "Candidate", "Cluster", "CollectiveCost", "DegreeConstraint", "Estimate",
    "GpuRef", "IntraNodeFabric", "Job", "Layout", "MemoryBreakdown", "Model", "MoE",
    "NetworkFabric", "NodeType", "Optimizer", "Plan", "RankEntry", "StepBreakdown",
    "layout_problem", "pipeline_stage_layers", "validate_layout",
]
