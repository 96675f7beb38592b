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


def microbatches_in_flight(layout: Layout, stage: int, num_microbatches: int) -> float:
    """Micro-batches whose activations rank ``stage`` holds at its peak, in units of its layers.

    Interleaved (Megatron): rank r runs ``2(p - r - 1) + (v - 1)p`` warm-up chunks plus one, each
    1/v of its layers, which for r = 0 is Megatron's ``p (1 + (p - 1)/(p v))`` (docs/sources.md
    9.2). That is the fewest a group of N contiguous micro-batches per virtual stage allows: with
    N (the Llama 3 paper's tunable N, megatron-core's ``microbatch_group_size_per_vp_stage``)
    the warm-up is ``2(p - r - 1) + (v - 1)N``, and megatron-core 0.16 refuses N outside [p, m]
    (pipeline_parallel/schedules.py, get_pp_rank_microbatches and its range check), so its
    default N = p is the lower bound. Other schedules: the module docstring.
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
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    return chunks / v


def saturated_microbatches(layout: Layout, num_microbatches: int) -> int:
    """A micro-batch count at most ``num_microbatches`` whose ``microbatches_in_flight`` equals
    its on every stage: the in-flight count of every schedule but GPipe stops growing by 2p
    micro-batches (1F1B's p - r, interleaved ``(v + 1)p - 1`` chunks of v per micro-batch, ZB-V
    and DualPipe at most p + 1), so memory need not be costed again for a larger global batch
    (memory.memory_estimate's cache key)."""
    m = max(1, num_microbatches)
    if layout.pp == 1:
        return 1
    if layout.pipeline_schedule == "gpipe":
        return m
    return min(m, 2 * layout.pp)


def parameter_copies(layout: Layout) -> int:
    """Copies of its stage's parameters each rank keeps: two under DualPipe."""
    return 2 if layout.pp > 1 and layout.pipeline_schedule == "dualpipe" else 1
