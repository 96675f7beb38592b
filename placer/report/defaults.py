"""Job defaults for ``recommend-layout``: a sequence length and a global batch that serve.

The rule, so users can predict it:

- ``seq_len``: the model's ``max_seq_len`` capped at 8,192 (Llama 3 pre-trained at 8,192 before its
  long-context stage, Dubey et al. 2024, section 3.4.1); 4,096 when the model does not say.
- ``global_batch``: the power of two nearest (in log scale) to ~4M tokens per step divided by
  ``seq_len`` (GPT-3 175B used 3.2M tokens, Brown et al. 2020, Table 2.1; Llama 3 405B started at
  4M, Dubey et al. 2024, section 3.4.1). A power of two divides every power-of-two data-parallel
  degree, so it rarely rules out a layout.

Each default used is reported as one line (``Plan.defaults_used``), naming the flag that sets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from placer.errors import InputError, PlacerError
from placer.spec.cluster import Cluster
from placer.spec.job import DegreeConstraint, Job, Optimizer
from placer.spec.model import Model

SEQ_LEN_CAP = 8192  # Llama 3 pre-training context (Dubey et al. 2024, section 3.4.1)
SEQ_LEN_UNKNOWN_MODEL = 4096  # Llama 2's context, a common default for older models
TARGET_TOKENS_PER_STEP = 4 * 2**20  # ~4M tokens (Brown et al. 2020; Dubey et al. 2024)


def default_seq_len(model: Model) -> int:
    if model.max_seq_len is None:
        return SEQ_LEN_UNKNOWN_MODEL
    return min(model.max_seq_len, SEQ_LEN_CAP)


def default_global_batch(seq_len: int) -> int:
    """Sequences per step: the power of two nearest ``TARGET_TOKENS_PER_STEP / seq_len``."""
    ideal = TARGET_TOKENS_PER_STEP / seq_len
    if ideal <= 1:
        return 1
    return int(2 ** round(math.log2(ideal)))


@dataclass(frozen=True)
class JobKnobs:
    """The job flags beyond sequence, batch and precision; None means "not given"."""

    job_file: Path | None = None
    global_batch_tokens: int | None = None
    memory_headroom_gib: float | None = None
    optimizer: str | None = None
    allow_tp_outside_nvlink: bool | None = None
    stack: str | None = None
    overlaps: str | None = None
    moe_imbalance: float | None = None
    torch_compile: bool | None = None
    """--torch-compile / --no-torch-compile: runtime.torch_compile."""
    gpu: str | None = None
    """--gpu: a GPU preset put in every node type of the cluster (``resolve_gpu``)."""


DEFAULT_STACK = "megatron-core"
"""The stack a job without ``--stack`` is planned for: the newest Megatron-Core preset, the
framework of the published recipes the baseline uses (NeMo, Megatron-Bridge)."""


NO_KNOBS = JobKnobs()
MAX_PLAUSIBLE_TOKENS_PER_STEP = 128 * 2**20
"""Twice the largest published batch (DeepSeek-V3: 15,360 sequences of 4,096 tokens, 63M tokens,
arXiv:2412.19437 section 4.2): more tokens per step than this is a typo, not a plan."""
MAX_PLAUSIBLE_STEP_S = 3600.0
"""Published pre-training steps take seconds to a minute (Llama 3 405B: 16M tokens in about 20
s on 16K H100s, Dubey et al. 2024 Table 4); an hour per step means the batch or the cluster is
not what was meant."""


def _batch_from_tokens(tokens: int, seq_len: int) -> int:
    if tokens < seq_len or tokens % seq_len:
        raise InputError("--global-batch-tokens", tokens,
                         f"must be a positive multiple of seq_len={seq_len} (tokens per step)")
    return tokens // seq_len


def resolve_job(model: Model, *, seq_len: int | None, global_batch: int | None,
                constraints: tuple[str, ...] = (), precision: str | None = "bf16",
                name: str = "placer-job", knobs: JobKnobs = NO_KNOBS,
                gpu_capacity_bytes: int | None = None) -> tuple[Job, list[str]]:
    """The job to plan for and one line per default that filled a missing flag.

    A ``--job`` file gives the starting values; flags replace the fields they name (constraints
    add to the file's). ``gpu_capacity_bytes`` (the smallest GPU) turns ``--memory-headroom``
    GiB into the job's fraction.
    """
    from placer.spec.presets import load_job, validated

    base = load_job(knobs.job_file).model_dump() if knobs.job_file is not None else {}
    used: list[str] = []
    if seq_len is None:
        seq_len = base.get("seq_len")
    if seq_len is None:
        seq_len = default_seq_len(model)
        if model.max_seq_len is None:
            why = f"model {model.name} gives no max_seq_len"
        elif model.max_seq_len > SEQ_LEN_CAP:
            why = f"the model's {model.max_seq_len:,} capped at {SEQ_LEN_CAP:,}"
        else:
            why = "the model's max_seq_len"
        used.append(f"seq_len={seq_len} ({why}; set --seq-len)")
    elif seq_len < 1:
        raise InputError("--seq-len", seq_len, "must be a positive integer")
    if global_batch is not None and knobs.global_batch_tokens is not None:
        raise InputError("--global-batch-tokens", knobs.global_batch_tokens,
                         "give either --global-batch (sequences) or --global-batch-tokens")
    if knobs.global_batch_tokens is not None:
        global_batch = _batch_from_tokens(knobs.global_batch_tokens, seq_len)
    if global_batch is None:
        global_batch = base.get("global_batch_size")
    if global_batch is None:
        global_batch = default_global_batch(seq_len)
        used.append(f"global_batch={global_batch} sequences ({global_batch * seq_len:,} tokens "
                    f"per step, the power of two nearest 4M tokens; set --global-batch)")
    elif global_batch < 1:
        raise InputError("--global-batch", global_batch, "must be a positive integer")
    parsed = list(base.get("constraints", ()))
    for text in constraints:
        try:
            parsed.append(DegreeConstraint.parse(text))
        except ValueError as exc:
            where = "--constraint" if repr(text) in str(exc) else f"--constraint {text!r}"
            raise PlacerError(f"{where}: {exc}") from None
    fields = {**base, "name": base.get("name", name), "seq_len": seq_len,
              "global_batch_size": global_batch, "constraints": parsed}
    if precision is not None:
        fields["precision"] = precision
    if knobs.optimizer is not None:
        fields["optimizer"] = Optimizer.named(knobs.optimizer)
    if knobs.allow_tp_outside_nvlink is not None:
        fields["allow_tp_outside_nvlink"] = knobs.allow_tp_outside_nvlink
    if knobs.stack is not None:
        fields["stack"] = knobs.stack
    elif fields.get("stack") is None:
        from placer.spec.stack import load_stack

        fields["stack"] = load_stack(DEFAULT_STACK).name
        used.append(f"stack={fields['stack']} (the newest {DEFAULT_STACK} preset: only layouts "
                    "it runs; set --stack)")
    runtime = dict(fields.get("runtime") or {})
    if knobs.overlaps is not None:
        runtime["overlaps"] = _overlaps(knobs.overlaps)
    if knobs.moe_imbalance is not None:
        runtime["moe_load_imbalance"] = knobs.moe_imbalance
    if knobs.torch_compile is not None:
        runtime["torch_compile"] = knobs.torch_compile
    if runtime:
        fields["runtime"] = runtime
    if runtime.get("expandable_segments") is None:
        used.append("allocator with expandable segments, no fragmentation allowance (placer's "
                    "env.sh exports PYTORCH_CUDA_ALLOC_CONF; if your launcher does not, set "
                    "runtime.expandable_segments: false in --job)")
    if knobs.memory_headroom_gib is not None:
        fields["memory_headroom"] = headroom_fraction(knobs.memory_headroom_gib,
                                                      gpu_capacity_bytes)
    job = validated(Job, fields, str(knobs.job_file) if knobs.job_file else "job")
    return job, used


def _overlaps(text: str) -> tuple[str, ...]:
    """``--overlap tp,dp_grad`` (or ``none``) as the runtime's overlaps."""
    from placer.spec.runtime import OVERLAPS

    if text.strip().lower() == "none":
        return ()
    names = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in OVERLAPS]
    if unknown or not names:
        raise InputError("--overlap", text, f"list of {', '.join(OVERLAPS)}, or none")
    return names


def headroom_fraction(gib: float, capacity_bytes: int | None) -> float:
    """``--memory-headroom`` GiB as the fraction of the smallest GPU the job keeps free."""
    if capacity_bytes is None or capacity_bytes <= 0:
        raise PlacerError("--memory-headroom needs a cluster with GPUs")
    fraction = gib * 2**30 / capacity_bytes
    if not 0.0 <= fraction < 0.9:
        limit = 0.9 * capacity_bytes / 2**30
        raise InputError("--memory-headroom", gib,
                         f"must be between 0 and {limit:.1f} GiB (90 % of the "
                         f"{capacity_bytes / 2**30:.1f} GiB GPU)")
    return fraction


def job_warnings(job: Job) -> list[str]:
    """What looks like a typo in the job: a batch given in tokens where sequences were asked."""
    tokens = job.tokens_per_step
    if tokens <= MAX_PLAUSIBLE_TOKENS_PER_STEP:
        return []
    batch = job.global_batch_size
    line = (f"global batch {batch:,} sequences x {job.seq_len:,} tokens = {tokens:,} tokens per "
            f"step, over {MAX_PLAUSIBLE_TOKENS_PER_STEP // 2**20}M (twice the largest published "
            "batch)")
    if batch % job.seq_len == 0:
        return [f"{line}; --global-batch counts sequences: probably meant --global-batch-tokens "
                f"{batch} ({batch // job.seq_len:,} sequences)"]
    return [f"{line}; --global-batch counts sequences, not tokens"]


def step_time_warnings(step_time_s: float, job: Job, num_gpus: int) -> list[str]:
    """A predicted step of more than an hour: the batch or the cluster is probably not meant."""
    if step_time_s <= MAX_PLAUSIBLE_STEP_S:
        return []
    return [f"the best layout takes {step_time_s / 3600:,.1f} h per step "
            f"({job.global_batch_size:,} sequences of {job.seq_len:,} tokens on {num_gpus} "
            "GPUs); published pre-training steps take seconds: check --global-batch (sequences, "
            "not tokens) and --nodes"]


def resolve_gpu(cluster: Cluster, gpu_ref: str | None) -> tuple[Cluster, list[str]]:
    """The cluster with the ``--gpu`` preset in every node type (fabric and NICs kept: a DGX A100
    with A100-40GB is the DGX A100 320GB), and the line saying what it replaced."""
    if gpu_ref is None:
        return cluster, []
    from placer.spec.presets import load_gpu

    gpu = load_gpu(gpu_ref)
    before = sorted({t.gpu.name for t in cluster.node_types})
    types = [t.model_copy(update={"gpu": gpu}).model_dump() for t in cluster.node_types]
    swapped = Cluster.model_validate({**cluster.model_dump(), "node_types": types})
    return swapped, [f"gpu={gpu.name} in every node (--gpu; the cluster had "
                     f"{', '.join(before)})"]


def resolve_nodes(cluster: Cluster, nodes: int | None, *, is_preset: bool) -> tuple[Cluster,
                                                                                   list[str]]:
    """Scale a single-pool cluster to ``nodes``; a preset's own size is reported as a default."""
    if nodes is not None:
        return cluster.with_nodes(nodes), []
    if not is_preset:
        return cluster, []
    return cluster, [f"nodes={cluster.num_nodes} (the size of preset {cluster.name}; set --nodes)"]
