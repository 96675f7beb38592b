"""DeepSpeed's optimizer wrapper per config (placer.cost.deepspeed_optimizer) against DeepSpeed's
own selection, and what each wrapper costs in memory on placer's DeepSpeed plans, by hand."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from helpers_check import DATA, only, run_check
from helpers_frameworks import need, run_worker

from placer.cost import memory_estimate
from placer.cost.deepspeed_optimizer import (
    FP16_STEP_BYTES_PER_PARAM,
    Wrapper,
    bf16_step_bytes,
    gradient_bytes,
    memory_flags,
    optimizer_wrapper,
    placer_wrapper,
)
from placer.cost.memory import fragmentation_fraction
from placer.cost.stack_options import job_options
from placer.spec import Job, Layout, Model
from placer.spec.presets import cluster_preset
from placer.spec.runtime import Runtime

# DeepSpeed's wrapper constants (deepspeed/runtime/constants.py: ZERO_OPTIMIZATION, BFLOAT16,
# FP16, DDP_BFLOAT16; None: the client optimizer) as the class _configure_optimizer builds.
CONSTANTS = {"bf16": "BF16_Optimizer", "fp16": "FP16_Optimizer", "ddp_bf16": "FP16_Optimizer",
             None: "client"}
PRECISIONS = ("fp32", "fp16", "bf16")


def _config(stage: int, precision: str, accumulation: str | None,
            offload: bool) -> dict[str, object]:
    config: dict[str, object] = {"train_micro_batch_size_per_gpu": 1,
                                 "zero_optimization": {"stage": stage}}
    if precision != "fp32":
        config[precision] = {"enabled": True}
    if accumulation is not None:
        config["data_types"] = {"grad_accum_dtype": accumulation}
    if offload:
        config["zero_optimization"] = {"stage": stage, "offload_optimizer": {"device": "cpu"}}
    return config


@pytest.mark.slow
def test_wrapper_rule_is_deepspeeds_own_selection(tmp_path: Path) -> None:
    """Every ZeRO stage x precision x accumulation dtype x pipeline (and CPU offload at the one
    stage where it matters): DeepSpeed's _do_optimizer_sanity_check picks the same wrapper, or
    refuses the same mixes."""
    version = need("deepspeed")
    grid = [(stage, precision, accumulation, pipeline, False)
            for stage, precision, accumulation, pipeline in itertools.product(
                range(4), PRECISIONS, (None, *PRECISIONS), (False, True))]
    grid += [(1, "bf16", "fp32", False, True), (2, "bf16", "fp32", False, True)]
    manifest = [{"id": str(i), "config": _config(s, p, a, o), "pipeline": pipe}
                for i, (s, p, a, pipe, o) in enumerate(grid)]
    results = run_worker("deepspeed_optimizer_select.py", [], manifest, tmp_path)
    for i, (stage, precision, accumulation, pipeline, offload) in enumerate(grid):
        got = results[str(i)]
        case = (stage, precision, accumulation, pipeline, offload)
        try:
            ours: Wrapper | None = optimizer_wrapper(stage, precision, pipeline,  # type: ignore[arg-type]
                                                     accumulation, offload)  # type: ignore[arg-type]
        except ValueError:
            ours = None
        if "error" in got:
            assert ours is None and "unsupported mix" in got["error"], (case, got)
            continue
        assert got["zero_stage"] == stage, case
        theirs = ({1: "DeepSpeedZeroOptimizer", 2: "DeepSpeedZeroOptimizer"}.get(
            stage, "DeepSpeedZeroOptimizer_Stage3") if got["wrapper"] == "zero_optimization"
            else CONSTANTS[got["wrapper"]])
        assert ours == theirs, (case, got, version)


# placer's deepspeed.json at each ZeRO stage, under the pipeline engine or not, and the one
# config that reaches BF16_Optimizer through fp32 accumulation: (id, config, pipeline).
ENGINE_CASES = (
    ("z0-pipe", {"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}}, True),
    ("z0", {"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}}, False),
    ("z1", {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}, False),
    ("z2", {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, False),
    ("z1-fp32", {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                 "data_types": {"grad_accum_dtype": "fp32"}}, False),
)
ENGINE_PARAMS, ENGINE_WORLD = 8192, 4  # tests/frameworks/deepspeed_optimizer_memory.py
DTYPES = {"float32": 4, "bfloat16": 2}


@pytest.mark.slow
def test_wrappers_hold_what_memory_prices_on_a_real_engine(tmp_path: Path) -> None:
    """deepspeed.initialize on CPU (4 data-parallel ranks, 8192 parameters, torch Adam): the
    wrapper is the rule's; BF16_Optimizer holds the fp32 master partition (1/4) and an
    unsharded flat gradient buffer of the accumulation dtype (2 B placer's way, 4 B with fp32
    accumulation), and its bf16 .grad is freed at the step (reallocated); ZeRO-1/2 drop .grad
    in the backward and hold an fp32 partition; FP16_Optimizer's .grad is freed at the step.
    torch Adam is no FusedAdam, so DeepSpeed builds FP16_UnfusedOptimizer (priced as the fused
    one, an upper bound)."""
    need("deepspeed")
    manifest = [{"id": i, "config": c, "pipeline": p} for i, c, p in ENGINE_CASES]
    env = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": str(ENGINE_WORLD),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    results = run_worker("deepspeed_optimizer_memory.py", [], manifest, tmp_path, env=env)
    for case_id, config, pipeline in ENGINE_CASES:
        got = results[case_id]
        assert "error" not in got, got["error"]
        accumulation = config.get("data_types", {}).get("grad_accum_dtype")  # type: ignore[attr-defined]
        stage = config["zero_optimization"]["stage"]  # type: ignore[index]
        ours = optimizer_wrapper(stage, "bf16", pipeline, accumulation)
        flags = memory_flags(ours)
        assert got["wrapper"].replace("Unfused", "") == ours, (case_id, got["wrapper"])
        assert got["after_step"] == [None, None], case_id  # freed at the step: reallocated
        buffers = got["buffers"]
        if ours == "BF16_Optimizer":
            assert buffers["fp32_groups_flat_partition"] == [[ENGINE_PARAMS // ENGINE_WORLD,
                                                             "float32"]], case_id
            (numel, dtype), = buffers["fp32_groups_gradients_flat"]
            assert numel == ENGINE_PARAMS, case_id
            assert DTYPES[dtype] == gradient_bytes(ours, "bf16", accumulation), case_id
        elif ours == "DeepSpeedZeroOptimizer":
            assert got["after_backward"] == [None, None] and flags["grads_reallocated"]
            assert buffers["single_partition_of_fp32_groups"] == [
                [ENGINE_PARAMS // ENGINE_WORLD, "float32"]], case_id
        else:
            assert got["after_backward"] == ["torch.bfloat16"] * 2 and flags["grads_reallocated"]


def test_bigscience_engine_picks_by_stage_then_precision() -> None:
    """DeepSpeed@56c5223 engine.py _configure_optimizer: ZeRO at stage >= 1, else fp16's
    FP16_Optimizer, else bf16's BF16_Optimizer, pipeline or not."""
    for pipeline in (False, True):
        assert optimizer_wrapper(1, "fp16", pipeline, release="2022") == "DeepSpeedZeroOptimizer"
        assert optimizer_wrapper(0, "bf16", pipeline, release="2022") == "BF16_Optimizer"
        assert optimizer_wrapper(0, "fp16", pipeline, release="2022") == "FP16_Optimizer"


def test_placers_deepspeed_json_runs_these_wrappers() -> None:
    """placer.dialects.deepspeed writes bf16 on, the layout's stage and no data_types."""
    assert placer_wrapper(0, 4) == "BF16_Optimizer"
    assert placer_wrapper(0, 1) == "FP16_Optimizer"  # DeepSpeed's DDP_BFLOAT16
    assert placer_wrapper(1, 4) == placer_wrapper(2, 1) == "DeepSpeedZeroOptimizer"
    assert placer_wrapper(3, 1) == "DeepSpeedZeroOptimizer_Stage3"


def test_bf16_step_copies_by_hand() -> None:
    """fp32 accumulation: the all-reduce's bf16 cast of every gradient (2 B each); bf16
    accumulation: the rank's fp32 partition (4 B each of params / dp)."""
    assert bf16_step_bytes(1e9, 1e9 / 8, 4) == 2e9
    assert bf16_step_bytes(1e9, 1e9 / 8, 2) == 4e9 / 8


SMALL = Model(name="small", num_layers=8, hidden_size=1024, num_attention_heads=8,
              vocab_size=32000, ffn_hidden_size=4096)


def _estimate(layout: Layout, stack: str | None) -> tuple[float, dict[str, float]]:
    """(parameters of the worst stage, its breakdown) with fragmentation allowed for."""
    job = Job(seq_len=256, global_batch_size=layout.dp * 8, stack=stack,
              runtime=Runtime(expandable_segments=False))
    mem = memory_estimate(SMALL, cluster_preset("dgx-h100").with_nodes(2), job, layout)
    params = mem.weights_bytes / job.optimizer.param_bytes
    return params, mem.model_dump()


def test_deepspeed_plan_at_stage_0_under_pipelining_is_bf16_optimizer_memory() -> None:
    """BF16_Optimizer with bf16 accumulation: the bf16 buffer and the bf16 .grad (2 + 2 B a
    parameter), fp32 master weights and Adam moments over the 8 data-parallel ranks (12 / 8),
    against Megatron's persistent fp32 gradients and unsharded state at ZeRO 0 (4 and 12)."""
    layout = Layout(pp=2, dp=8)
    assert job_options(Job(seq_len=256, global_batch_size=64,
                           stack="deepspeed@0.19")).deepspeed_engine
    params, ds = _estimate(layout, "deepspeed@0.19")
    _, megatron = _estimate(layout, None)
    assert ds["gradients_bytes"] == pytest.approx(4 * params, rel=1e-9)
    assert ds["optimizer_bytes"] == pytest.approx(12 * params / 8, rel=1e-9)
    assert megatron["gradients_bytes"] == pytest.approx(4 * params, rel=1e-9)
    assert megatron["optimizer_bytes"] == pytest.approx(12 * params, rel=1e-9)
    # the bf16 .grad is handed out again every step: counted toward the fragmentation allowance
    dynamic = ds["activations_bytes"] + ds["logits_bytes"] + ds["moe_buffers_bytes"]
    fraction = fragmentation_fraction(layout)
    share = fraction / (1 - fraction)
    assert ds["fragmentation_bytes"] == pytest.approx((dynamic + 2 * params) * share, rel=1e-6)


def test_deepspeed_plan_at_zero_1_reallocates_bf16_gradients() -> None:
    """DeepSpeedZeroOptimizer stage 1: model-dtype .grad (2 B) dropped into its buckets."""
    layout = Layout(pp=2, dp=8, zero_stage=1)
    params, ds = _estimate(layout, "deepspeed@0.19")
    assert ds["gradients_bytes"] == pytest.approx(2 * params, rel=1e-9)
    assert ds["optimizer_bytes"] == pytest.approx(12 * params / 8, rel=1e-9)
    dynamic = ds["activations_bytes"] + ds["logits_bytes"] + ds["moe_buffers_bytes"]
    fraction = fragmentation_fraction(layout)
    share = fraction / (1 - fraction)
    assert ds["fragmentation_bytes"] == pytest.approx((dynamic + 2 * params) * share, rel=1e-6)


def test_deepspeed_plan_at_stage_0_without_pipelining_peaks_at_fp16_optimizer_step() -> None:
    """FP16_Optimizer (DDP_BFLOAT16): at the step the bf16 .grad (2 B), the fp32 casts and their
    flat copy (8 B) beside weights and unsharded state (2 + 12 B); the activations are gone."""
    params, ds = _estimate(Layout(dp=16), "deepspeed@0.19")
    assert ds["gradients_bytes"] == pytest.approx((2 + FP16_STEP_BYTES_PER_PARAM) * params,
                                                  rel=1e-9)
    assert ds["activations_bytes"] == 0 and ds["fragmentation_bytes"] == 0
    assert ds["optimizer_bytes"] == pytest.approx(12 * params, rel=1e-9)


# ----- placer check of DeepSpeed configs ---------------------------------------------------------

def _ds_config(tmp_path: Path, **extra: object) -> Path:
    import json

    data = json.loads((DATA / "ds_zero3_llama3_8b.json").read_text())
    data.update(extra)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_check_names_deepspeeds_refusal_of_bf16_with_fp32_accumulation_at_stage_0() -> None:
    found = only(run_check("ds_bf16_fp32_accum_stage0.json", model="llama3-8b", seq_len=4096),
                 "framework-refuses")
    assert "unsupported mix" in found.message and found.severity == "error"


def test_check_prices_fp16_optimizer_step_at_stage_0(tmp_path: Path) -> None:
    """bf16 at stage 0 without the pipeline engine runs FP16_Optimizer: at its step the bf16
    .grad (2 B) and the fp32 casts with their flat copy (8 B) beside 2-byte weights and 12
    bytes of unsharded state: gradients 5x and optimizer 6x the weights in the message."""
    import re

    config = _ds_config(tmp_path, zero_optimization={"stage": 0})
    report = run_check(config, model="llama3-8b", seq_len=4096)
    assert any("FP16_Optimizer" in n for n in report.configs[0].notes)
    found = only(report, "memory-over-capacity")
    parts = {k: float(v) for k, v in re.findall(r"(\w+) (\d+\.\d)", found.message)}
    assert parts["gradients"] / parts["weights"] == pytest.approx(5, rel=0.01)
    assert parts["optimizer"] / parts["weights"] == pytest.approx(6, rel=0.01)


def test_check_reads_bf16_optimizer_from_fp32_accumulation_at_stage_1() -> None:
    """ZeRO stage 1 + bf16 + data_types fp32: BF16_Optimizer, 4-byte gradients."""
    from placer.check.parse_deepspeed import parse_deepspeed

    data = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
            "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}}
    parsed = parse_deepspeed(Path("ds.json"), data, "{}")
    assert parsed.settings.deepspeed_optimizer == "BF16_Optimizer"
    assert not parsed.settings.grad_reduce_bf16 and not parsed.problems
    data["bf16"] = {"enabled": "auto"}  # the HF Trainer's: left to the launcher
    assert parse_deepspeed(Path("ds.json"), data, "{}").settings.deepspeed_optimizer is None


def test_check_megatron_deepspeed_without_pipeline_is_not_bf16_optimizer() -> None:
    """--no-pipeline-parallel: no PipelineModule, so bf16 at stage 0 is FP16_Optimizer and its
    optimizer state is not sharded (not checked as ZeRO-1)."""
    from placer.check.parse_megatron import parse_megatron

    script = ("deepspeed --num_gpus 8 pretrain_gpt.py --deepspeed --bf16 --zero-stage 0 "
              "--deepspeed_config ds.json --tensor-model-parallel-size 2 {} "
              "--num-layers 24 --hidden-size 2048 --num-attention-heads 16\n")
    piped = parse_megatron(Path("ds.sh"), script.format("")).settings
    plain = parse_megatron(Path("ds.sh"), script.format("--no-pipeline-parallel")).settings
    assert (piped.deepspeed_optimizer, piped.zero_stage) == ("BF16_Optimizer", 1)
    assert (plain.deepspeed_optimizer, plain.zero_stage) == ("FP16_Optimizer", 0)


def test_check_reads_zero3_live_parameter_limit() -> None:
    """stage3_max_live_parameters (DeepSpeed's default 1e9 when absent) prices ZeRO-3's fetch."""
    import json

    from placer.check.parse_deepspeed import parse_deepspeed

    data = json.loads((DATA / "ds_zero3_llama3_8b.json").read_text())
    assert parse_deepspeed(Path("ds.json"), data, "{}").settings.zero3_max_live_params == 1e9
    data["zero_optimization"]["stage3_max_live_parameters"] = 3e7
    parsed = parse_deepspeed(Path("ds.json"), data, "{}")
    assert parsed.settings.zero3_max_live_params == 3e7
    assert parsed.settings.deepspeed_optimizer == "DeepSpeedZeroOptimizer_Stage3"


def _dp_messages(layout: Layout, stack: str | None) -> dict[str, int]:
    """Bytes of each data-parallel collective of ``layout`` for SMALL on two DGX H100 nodes."""
    from placer.cost import estimate

    est = estimate(SMALL, cluster_preset("dgx-h100").with_nodes(2),
                   Job(seq_len=256, global_batch_size=128, stack=stack), layout)
    return {c.collective: c.message_bytes for c in est.collectives if c.dimension == "dp"}


def test_deepspeed_stack_reduces_gradients_in_bf16() -> None:
    """DeepSpeed 0.19's communication dtype follows bf16.enabled (engine.py
    communication_data_type): the ZeRO-1 gradient reduce-scatter moves as many bytes as the
    bf16 parameter all-gather, against twice as many for Megatron's fp32 main gradients."""
    layout = Layout(dp=16, zero_stage=1)
    ds, megatron = _dp_messages(layout, "deepspeed@0.19"), _dp_messages(layout, None)
    assert ds["reduce_scatter"] == ds["all_gather"] == megatron["all_gather"]
    assert megatron["reduce_scatter"] == 2 * megatron["all_gather"]


def test_bf16_optimizer_at_stage_0_all_reduces_and_gathers_back() -> None:
    """BF16_Optimizer (ZeRO 0 under the pipeline engine): the bf16 gradient all-reduce, then
    the updated bf16 parameters all-gathered over DP (bf16_optimizer.py update_lp_params);
    Megatron's ZeRO 0 all-reduces fp32 main gradients and gathers nothing."""
    layout = Layout(pp=2, dp=8)
    ds, megatron = _dp_messages(layout, "deepspeed@0.19"), _dp_messages(layout, None)
    assert set(ds) == {"all_reduce", "all_gather"} and ds["all_gather"] == ds["all_reduce"]
    assert set(megatron) == {"all_reduce"} and megatron["all_reduce"] == 2 * ds["all_reduce"]
