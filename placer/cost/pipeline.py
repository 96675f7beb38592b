"""Pipeline schedules: the bubble each leaves and the micro-batches each keeps in flight.

Times are per micro-batch on one pipeline rank, over all the layers the rank holds: ``F``
forward, ``B`` the full backward (input and weight gradients, and recomputation), ``W`` its
weight-gradient part. A V-shaped or looped schedule's chunk is ``1/v`` of that. Bubbles:

- GPipe and 1F1B: ``(p-1)(F+B)`` (Narayanan et al. 2021, arXiv:2104.04473, section 2.2.1);
- interleaved 1F1B: ``(p-1)(F+B)/v`` (same paper, section 2.2.2);
- ZB-H1 ("zb1p", torch's InterleavedZeroBubble when looped): ``(p-1)(F+B-2W)``, divided by
  ``v`` when looped (Qi et al. 2024, arXiv:2401.10241, ZB-H1 ``(p-1)(T_F+T_B-T_W)`` with their
  ``T_B`` the input-gradient pass; DeepSeek-V3 technical report arXiv:2412.19437 Table 2 writes it
  with the full backward: ``(PP-1)(F+B-2W)``);
- ZB-V: ``(p-1)(F_c+B_c-3W_c)`` in chunk times, i.e. ``(p-1)(F+B-3W)/2`` (Qi et al. 2024,
  section 6: ``(p-1)(T_F+T_B-2T_W)`` with ``T_B`` the input-gradient pass, zero when the three
  passes take equal time);
- DualPipe: ``(p/2-1)(F&B+B-3W)``; DualPipeV, on ``p`` ranks of two chunks (``PP = 2p`` stages):
  ``(p-1)(F&B_c+B_c-3W_c)`` (deepseek-ai/DualPipe README, "Pipeline Bubbles and Memory Usage").
  ``F&B`` is a forward and a backward chunk run together with each other's communication
  hidden; their compute adds up, so ``F&B = F + B`` here.

Micro-batches in flight on rank ``r`` (the activations it holds at its peak, in units of its
whole layers): GPipe ``m``; 1F1B and ZB-H1 ``min(p-r, m)`` (ZB-H1 keeps 1F1B's peak, Qi et al.
section 3.1); interleaved Megatron's warm-up; ZB-V ``p`` (same peak as 1F1B, section 6, on every
rank of the V); DualPipe ``p+1`` and DualPipeV ``2p+1`` chunks = ``p + 1/2`` (DualPipe README
"Activation" column). DualPipe keeps two copies of the parameters (README "Parameter" 2x).
"""

from __future__ import annotations

from functools import lru_cache

from placer.spec.layout import Layout


def bubble_s(schedule: str, pp: int, vpp: int, forward_s: float, backward_s: float,
             weight_grad_s: float) -> float:
    """Idle time of one rank per step under ``schedule`` (module docstring), never negative."""
    p, f, b, w = pp, forward_s, backward_s, weight_grad_s
    if p <= 1:
        return 0.0
    if schedule in ("1f1b", "gpipe"):
        bubble = (p - 1) * (f + b)
    elif schedule == "interleaved":
        bubble = (p - 1) * (f + b) / vpp
    elif schedule == "zb1p":
        bubble = (p - 1) * (f + b - 2 * w) / vpp
    elif schedule == "zbv":
        bubble = (p - 1) * (f + b - 3 * w) / 2
    elif schedule == "dualpipev":
        bubble = (p - 1) * ((f + b) + b - 3 * w) / 2
    elif schedule == "dualpipe":
        bubble = (p / 2 - 1) * ((f + b) + b - 3 * w)
    else:
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    return max(0.0, bubble)


def microbatches_in_flight(layout: Layout, stage: int, num_microbatches: int,
                           chunks: tuple[int, ...] | None = None) -> float:
    """Micro-batches whose activations rank ``stage`` holds at its peak, in units of its layers.

    Interleaved: rank r runs ``2(p - r - 1) + (v - 1)N`` warm-up chunks plus one, N contiguous
    micro-batches per virtual stage (the Llama 3 paper's tunable N, megatron-core's
    ``microbatch_group_size_per_vp_stage``), which for N = p and r = 0 is Megatron's
    ``p (1 + (p - 1)/(p v))`` (docs/sources.md 9.2). megatron-core 0.16 refuses N outside
    [p, m] and a last group of fewer than p (pipeline_parallel/schedules.py, its range and
    remainder checks), so with its default N = p it runs only m a multiple of p; torch 2.13's
    ScheduleInterleaved1F1B takes any m, with N = m // max(1, m // p) (its "flex_pp" rounds),
    which is p where m is a multiple of p and up to 2p - 1 where it is not: that N is counted.

    ``chunks`` are the split's decoder layers per virtual stage (PipelineSplit.chunks, looped:
    chunk c on rank c % p). Where a rank's chunks differ (an uneven split, an empty first or
    last chunk), its in-flight layers are counted chunk by chunk along the schedule's own
    order (``_interleaved_peak_layers``), then given in units of the rank's layers; MoE and
    dense layers weigh alike there. Other schedules: the module docstring.
    """
    p, v, m = layout.pp, layout.vpp, max(1, num_microbatches)
    if p == 1:
        return 1.0
    schedule = layout.pipeline_schedule
    if schedule == "gpipe":
        return float(m)
    if schedule in ("zbv", "dualpipev", "dualpipe"):
        held = float(p) if schedule == "zbv" else p + (0.5 if schedule == "dualpipev" else 1.0)
        return min(held, float(m))
    if v == 1:  # 1F1B, and ZB-H1 on one stage per rank
        return float(min(p - stage, m))
    group = interleaved_group(p, m)
    if chunks is not None and len(chunks) == p * v:
        own = tuple(chunks[stage::p])
        if len(set(own)) > 1:
            return _interleaved_peak_layers(p, v, m, group, stage, own) / sum(own)
    held = min(2 * (p - stage - 1) + (v - 1) * group + 1, m * v)
    return held / v


def interleaved_group(pp: int, num_microbatches: int) -> int:
    """Contiguous micro-batches per virtual stage, N, of the interleaved schedule: torch 2.13's
    ``n_microbatches // max(1, n_microbatches // pp)`` (ScheduleInterleaved1F1B), which is
    megatron-core's default N = pp wherever megatron-core runs it (m a multiple of pp)."""
    m = max(1, num_microbatches)
    return m // max(1, m // pp)


@lru_cache(maxsize=16384)
def _interleaved_peak_layers(p: int, v: int, m: int, group: int, rank: int,
                             own: tuple[int, ...]) -> int:
    """Most decoder layers rank ``rank`` holds activations of at once under interleaved 1F1B
    with ``own[i]`` layers in its i-th chunk. The order is megatron-core's schedule table
    (get_schedule_table: chunk-major groups of ``group`` micro-batches, the last group what is
    left; the backward runs the table's chunks reversed) and torch's forward_stage_index /
    backward_stage_index, the same where ``group`` divides m: the warm-up forwards, then a
    forward before each backward, then the remaining backwards."""
    table = [chunk for start in range(0, m, group)
             for chunk in range(v) for _ in range(start, min(start + group, m))]
    total = m * v
    warmup = min(2 * (p - rank - 1) + (v - 1) * group, total)
    held = peak = sum(own[chunk] for chunk in table[:warmup])
    for k in range(total - warmup):
        held += own[table[warmup + k]]
        peak = max(peak, held)
        held -= own[v - 1 - table[k]]
    return peak


def saturated_microbatches(layout: Layout, num_microbatches: int) -> int:
    """A micro-batch count at most ``num_microbatches`` whose ``microbatches_in_flight`` equals
    its on every stage: the in-flight count of every schedule but GPipe stops growing by 2p
    micro-batches (1F1B's p - r, interleaved ``(v + 1)p - 1`` chunks of v per micro-batch, ZB-V
    and DualPipe at most p + 1), so memory need not be costed again for a larger global batch
    (memory.memory_estimate's cache key). The interleaved schedule's N moves with m where m is
    no multiple of p (``interleaved_group``): there the count is m itself."""
    m = max(1, num_microbatches)
    if layout.pp == 1:
        return 1
    if layout.pipeline_schedule == "gpipe":
        return m
    if layout.vpp > 1 and layout.pipeline_schedule in ("interleaved", "zb1p") and m % layout.pp:
        return m
    return min(m, 2 * layout.pp)


def parameter_copies(layout: Layout) -> int:
    """Copies of its stage's parameters each rank keeps: two under DualPipe."""
    return 2 if layout.pp > 1 and layout.pipeline_schedule == "dualpipe" else 1
