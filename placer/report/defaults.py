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

from placer.errors import InputError, PlacerError
from placer.spec.cluster import Cluster
from placer.spec.job import DegreeConstraint, Job
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


def resolve_job(model: Model, *, seq_len: int | None, global_batch: int | None,
                constraints: tuple[str, ...] = (), precision: str = "bf16",
                name: str = "placer-job") -> tuple[Job, list[str]]:
    """The job to plan for and one line per default that filled a missing flag."""
    used: list[str] = []
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
    if global_batch is None:
        global_batch = default_global_batch(seq_len)
        used.append(f"global_batch={global_batch} sequences ({global_batch * seq_len:,} tokens "
                    f"per step, the power of two nearest 4M tokens; set --global-batch)")
    elif global_batch < 1:
        raise InputError("--global-batch", global_batch, "must be a positive integer")
    parsed = []
    for text in constraints:
        try:
            parsed.append(DegreeConstraint.parse(text))
        except ValueError as exc:
            where = "--constraint" if repr(text) in str(exc) else f"--constraint {text!r}"
            raise PlacerError(f"{where}: {exc}") from None
    from placer.spec.presets import validated

    job = validated(Job, {"name": name, "seq_len": seq_len, "global_batch_size": global_batch,
                          "precision": precision, "constraints": parsed}, "job")
    return job, used


def resolve_nodes(cluster: Cluster, nodes: int | None, *, is_preset: bool) -> tuple[Cluster,
                                                                                   list[str]]:
    """Scale a single-pool cluster to ``nodes``; a preset's own size is reported as a default."""
    if nodes is not None:
        return cluster.with_nodes(nodes), []
    if not is_preset:
        return cluster, []
    return cluster, [f"nodes={cluster.num_nodes} (the size of preset {cluster.name}; set --nodes)"]
