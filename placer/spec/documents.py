"""The JSON documents placer writes besides the plan: the rank map, the replay program and the
calibration sweep its workers read, and what the workers and ``placer verify`` write back.

These models are what ``placer schema`` prints; each writer validates its document through its
model before writing (``document``), so a file cannot drift from its schema. Field names follow
the files as they have always been written; memory and message sizes are bytes, times seconds.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from placer.dims import Dim, Group, Part
from placer.spec.base import Output
from placer.spec.layout import Layout
from placer.spec.profile import CollectiveName, GemmProfile, LinkProfile
from placer.spec.results import Estimate

RANKMAP_FORMAT = "placer-rankmap/1"
REPLAY_FORMAT = "placer-replay/1"
BENCH_FORMAT = "placer-bench/1"
VERIFY_FORMAT = "placer-verify/1"

LinkClassName = Literal["intra_node", "inter_node"]
T = TypeVar("T", bound=BaseModel)


def document(model: type[T], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` checked against ``model`` (a mistake in placer, not the user's: it raises), and
    returned as written, key order kept."""
    model.model_validate(data)
    return data


# ----- placer estimate --json ------------------------------------------------------------------


class EstimateDocument(Estimate):
    """``placer estimate --json``: the estimate with what it was asked about."""

    model: str
    cluster: str
    num_gpus: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    global_batch_size: int = Field(ge=1)
    precision: str
    defaults_used: list[str]


# ----- rankmap.json ----------------------------------------------------------------------------


class RankMapNode(Output):
    """One node of the job, in torchrun's node order."""

    index: int = Field(ge=0, description="torchrun node rank")
    num_ranks: int = Field(ge=1)
    cuda_visible_devices: str = Field(description="what CUDA_VISIBLE_DEVICES is set to")
    cluster_node: int = Field(ge=0, description="index of the node in the cluster description")
    hostname: str | None
    node_type: str


class RankMapRank(Output):
    """Where one global rank runs, its grid coordinates and its group of each kind."""

    rank: int = Field(ge=0)
    node: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    gpu: int = Field(ge=0, description="physical GPU index on the node")
    coords: dict[Dim, int]
    groups: dict[Group, int] = Field(description="index into the top-level groups, per kind")


class RankMapDocument(Output):
    """``rankmap.json``: what ``placer_mesh.py`` validates and builds its process groups from."""

    format: Literal["placer-rankmap/1"] = RANKMAP_FORMAT
    job: str | None
    layout: str = Field(description="compact layout, e.g. tp=8,pp=4,dp=2,...")
    mesh_order: str = Field(description="rank order, innermost first, e.g. tp-cp-dp-pp")
    world_size: int = Field(ge=1)
    backend_hint: str
    mesh_dim_names: list[Dim] = Field(description="outermost first, as DeviceMesh takes them")
    mesh_shape: list[int]
    mesh: list[Any] = Field(description="torchrun ranks nested as mesh_shape")
    nodes: list[RankMapNode]
    ranks: list[RankMapRank]
    groups: dict[Group, list[list[int]]] = Field(description="every group of every kind, sorted")


# ----- the replay program (replay.json) --------------------------------------------------------


class ReplayOpKind(Output):
    """One distinct communication op: a collective of one size on one group."""

    id: int = Field(ge=0)
    dimension: Part
    collective: CollectiveName
    bytes: int = Field(ge=0, description="message size per call")
    group_size: int = Field(ge=1)
    group: Group
    link_class: str
    predicted_s: float = Field(ge=0)


class ReplayProgramDocument(Output):
    """What every rank of a replay runs: op kinds and each stage's list of ops.

    An op is ``[code, argument]``: ``g`` GEMM calls; ``c`` a collective and ``x`` a CP ring
    exchange (argument: the kind); ``s``/``r`` activations sent to the next / received from the
    previous stage, ``S``/``R`` gradients sent to the previous / received from the next."""

    format: Literal["placer-replay/1"] = REPLAY_FORMAT
    gemm_n: int = Field(ge=1, description="square GEMM size of the compute stand-in")
    kinds: list[ReplayOpKind]
    stages: list[list[tuple[Literal["g", "c", "x", "s", "r", "S", "R"], int]]]


class ReplayConfig(ReplayProgramDocument):
    """The replay worker's config: the program and how to run it."""

    job_dir: str
    backend: str
    timeout_s: float = Field(gt=0)
    warmup_steps: int = Field(ge=0)
    steps: int = Field(ge=1)


# ----- the calibration sweep (bench_config.json, bench.json) ----------------------------------


class BenchTest(Output):
    link_class: LinkClassName
    group_size: int = Field(ge=2)
    collective: CollectiveName
    sizes_bytes: list[int]


class BenchConfig(Output):
    """``bench_config.json``: what the calibration worker measures."""

    backend: str
    timeout_s: float = Field(gt=0)
    batches: int = Field(ge=1)
    min_batch_s: float = Field(gt=0)
    max_calls: int = Field(ge=1)
    gemm_min_batch_s: float = Field(gt=0)
    gemm_sizes: list[int]
    tests: list[BenchTest]


class BenchGemm(Output):
    n: int = Field(ge=1)
    flops: int | None = Field(default=None, ge=0)
    calls_per_batch: int | None = Field(default=None, ge=1)
    times_s: list[float] = Field(description="per-call seconds of each timed batch")


class BenchPoint(Output):
    size_bytes: int = Field(ge=0)
    calls_per_batch: int | None = Field(default=None, ge=1)
    times_s: list[float] = Field(description="per-call seconds of each timed batch")


class BenchCollective(Output):
    """One test's measurements, as its group's first rank timed them."""

    link_class: LinkClassName
    group_size: int = Field(ge=2)
    collective: CollectiveName
    sizes_bytes: list[int] | None = None
    ranks: list[int] = Field(description="the ranks measured together")
    points: list[BenchPoint]


class BenchResults(Output):
    """``bench.json``: the calibration worker's measurements (``calibrate --from``). What the
    fit reads is required; the worker also records where it ran."""

    format: Literal["placer-bench/1"] = BENCH_FORMAT
    backend: str
    world_size: int = Field(ge=1)
    gemm: dict[str, list[BenchGemm]] = Field(description="per rank")
    collectives: list[BenchCollective]
    device: str | None = None
    torch: str | None = None
    nodes: list[list[int]] | None = Field(default=None, description="ranks of each node")
    gemm_dtype: str | None = None


# ----- placer verify --json / --out ------------------------------------------------------------


class GemmStandIn(Output):
    n: int = Field(ge=0)
    predicted_call_s: float
    measured_call_s: float | None


class AfterRefit(Output):
    """A candidate re-predicted after the link profile was refitted from the replays."""

    predicted_step_s: float
    predicted_parts_s: dict[str, float]
    relative_error: float | None = None
    leave_one_out_predicted_step_s: float | None = None


class VerifiedCandidate(Output):
    index: int = Field(ge=0)
    layout: Layout
    layout_text: str
    mesh_order: str
    status: Literal["ok", "failed", "timeout", "skipped"]
    predicted_step_s: float | None = Field(description="the replay's simulated step time")
    measured_step_s: float | None
    relative_error: float | None = Field(description="(predicted - measured) / measured")
    measured_steps_s: list[float]
    estimate_step_s: float | None = Field(description="the cost model's full-scale estimate")
    plan_step_s: float = Field(description="the step time the plan file records")
    predicted_parts_s: dict[str, float]
    wall_s: float
    gemm_stand_in: GemmStandIn
    error: str | None = None
    after_calibration: AfterRefit | None = None


class Ranking(Output):
    """How well the predictions ranked the candidates that ran."""

    kendall_tau: float | None
    predicted_best: int | None = None
    measured_best: int | None = None
    predicted_best_is_measured_best: bool | None
    max_abs_relative_error: float | None
    median_abs_relative_error: float | None = None


class RankingAfterRefit(Ranking):
    ranking_change_tau: float | None
    order_before: list[int]
    order_after: list[int]
    leave_one_out_max_abs_relative_error: float | None


class MeasuredPoint(Output):
    size_bytes: int
    measured_s: float
    residual: float


class AlphaBeta(Output):
    latency_s: float
    bandwidth_bytes_per_s: float


class Refit(Output):
    link_class: str
    collective: str
    freed: str
    candidates: list[int]
    before: AlphaBeta
    after: AlphaBeta
    points: list[MeasuredPoint]


class GemmRefit(Output):
    before: float | None
    after: float | None


class Calibration(Output):
    """The refitted profile and what changed."""

    profile: LinkProfile
    refits: list[Refit]
    compute_scale: float | None
    gemm_max_efficiency: GemmRefit
    left_out: list[str]


class VerifyResults(Ranking):
    """``placer verify --json`` / ``--out``: every candidate so far, and once all have run the
    ranking comparison (the ``Ranking`` fields, null until then)."""

    format: Literal["placer-verify/1"] = VERIFY_FORMAT
    plan: str
    launcher: str
    profile: str
    scale: float
    steps: int
    warmup_steps: int
    candidate_timeout_s: float
    candidates: list[VerifiedCandidate]
    complete: bool
    kendall_tau: float | None = None
    predicted_best_is_measured_best: bool | None = None
    max_abs_relative_error: float | None = None
    after_calibration: RankingAfterRefit | None = None
    calibration: Calibration | None = None


# ----- placer verify --real-model: the model worker's config and the results -------------------

REAL_MODEL_FORMAT = "placer-real-model/1"
VERIFY_REAL_MODEL_FORMAT = "placer-verify-real-model/1"


class RealModelShape(Output):
    """The architecture the model worker builds (placer/verify/workers/model.py)."""

    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    ffn_hidden_size: int = Field(ge=1)
    gated_mlp: bool
    vocab_size: int = Field(ge=1)
    tied_embeddings: bool
    moe: dict[str, Any] | None = Field(description="the model file's moe section")
    moe_layers: list[int] = Field(description="indices of the MoE layers")


class RealModelConfig(Output):
    """verify --real-model's model.json: what each rank trains, with which layout."""

    format: Literal["placer-real-model/1"] = REAL_MODEL_FORMAT
    job_dir: str = Field(description="the candidate's launch folder (rankmap.json)")
    backend: str
    timeout_s: float
    steps: int = Field(ge=1)
    warmup_steps: int = Field(ge=0)
    model: RealModelShape
    layout: Layout
    chunks: list[int] = Field(description="decoder layers of every virtual pipeline stage")
    schedule: str
    seq_len: int = Field(ge=1)
    microbatches: int = Field(ge=1, description="per data-parallel rank and step")
    tokens_per_step: int = Field(ge=1)
    optimizer: dict[str, Any] = Field(description="the job's optimizer (bytes per parameter)")
    device_memory_bytes: int = Field(ge=1, description="on CPU: where a rank runs out of memory")


class RealModelCandidate(Output):
    index: int = Field(ge=0)
    layout_text: str
    mesh_order: str
    status: Literal["ok", "oom", "failed", "timeout", "skipped"]
    device: str
    predicted_step_s: float | None
    measured_step_s: float | None
    measured_steps_s: list[float]
    tokens_per_s: float | None
    predicted_memory_bytes: int | None = Field(
        description="placer's peak less CUDA context/NCCL and fragmentation (eager PyTorch)")
    predicted_memory_parts_bytes: dict[str, int] = Field(
        description="the memory model's own parts (before a profile's memory terms)")
    peak_allocated_bytes: int | None = Field(
        description="the worst rank's peak: max_memory_allocated on GPUs, live bytes on CPU")
    peak_reserved_bytes: int | None
    static_bytes: int | None = Field(description="the worst rank's weights + optimizer state")
    worst_rank: int | None
    memory_relative_error: float | None = Field(description="(predicted - measured) / measured")
    wall_s: float
    predicted_compute_s: float
    after_refit_predicted_step_s: float | None
    error: str | None = None


class RealModelResults(Output):
    """``placer verify --real-model --json`` / ``--out``."""

    format: Literal["placer-verify-real-model/1"] = VERIFY_REAL_MODEL_FORMAT
    plan: str
    launcher: str
    steps: int
    compared_memory: str
    gpu: str = Field(description="the plan's GPU: what the predictions (and a profile fitted "
                     "from these results) are for")
    gemm: GemmProfile = Field(description="the GEMM constants the step-time predictions used")
    profile: LinkProfile | None = Field(description="the --profile predictions used (null: "
                                        "the cost model's presets)")
    candidates: list[RealModelCandidate]
    max_abs_memory_relative_error: float | None
    calibration: Calibration | None = None
