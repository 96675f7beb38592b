"""Megatron, torchtitan and DeepSpeed outputs, checked against the frameworks' documented keys.

tests/fixtures/launch_framework_keys.json lists the documented flags and keys with their
sources; the Megatron array is parsed by an argparse parser built from that list (so an unknown
flag or a missing value fails), after bash has expanded it from the generated file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers_launch import (
    JOB,
    candidate,
    mixed_cluster,
    plan,
    plan_2x2_tp_intra,
    plan_2x4_moe_remapped,
    small_cluster,
)

from placer.errors import PlacerError
from placer.launch import launch_bundle, launch_files
from placer.spec import Job, Layout, Plan
from placer.spec.presets import model_preset
from placer.spec.runtime import Runtime

# Python 3.11+ standard library; placer supports 3.10, where these TOML checks are skipped.
tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
KEYS = json.loads((Path(__file__).parent / "fixtures" / "launch_framework_keys.json").read_text())


def _files(p: Plan) -> dict[str, str]:
    return {f.name: f.text for f in launch_files(p)}


def _unwrapped(text: str) -> str:
    """Comment lines joined into one line, so assertions do not depend on wrapping."""
    return " ".join(line.lstrip("#").strip() for line in text.splitlines()
                    if line.startswith("#"))


def _megatron(p: Plan, tmp_path: Path) -> tuple[argparse.Namespace, str]:
    text = _files(p)["megatron_args.sh"]
    path = tmp_path / "megatron_args.sh"
    path.write_text(text)
    done = subprocess.run(["bash", "-c", f'source {path}; printf "%s\\0" "${{MEGATRON_ARGS[@]}}"'],
                          capture_output=True, text=True, check=True, timeout=30)
    argv = done.stdout.split("\0")[:-1]
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flag, kind in KEYS["megatron"]["flags"].items():
        if kind == "flag":
            parser.add_argument(flag, action="store_true")
        elif kind == "int":
            parser.add_argument(flag, type=int)
        elif kind == "str":
            parser.add_argument(flag)
        elif kind == "list[str]":
            parser.add_argument(flag, nargs="+")
        else:
            parser.add_argument(flag, choices=kind)
    namespace, unknown = parser.parse_known_args(argv)
    assert unknown == [], f"undocumented Megatron arguments: {unknown}"
    assert len(argv) == len(set(a for a in argv if a.startswith("--"))) + sum(
        1 for a in argv if not a.startswith("--"))  # each flag once
    return namespace, text


def _plan(layout: Layout, order: tuple[str, ...] = ("tp", "cp", "dp", "pp"),
          job: Job = JOB, model: str = "llama3-8b", nodes: int = 2, gpus: int = 8) -> Plan:
    m, cluster = model_preset(model), small_cluster(nodes, gpus)
    return plan(m, cluster, [candidate(m, cluster, job, layout, order=order)], job=job)


def test_megatron_remapped_moe_plan(tmp_path: Path) -> None:
    args, text = _megatron(plan_2x4_moe_remapped(), tmp_path)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
            args.context_parallel_size) == (2, 1, 2)
    assert (args.num_experts, args.expert_model_parallel_size,
            args.expert_tensor_parallel_size) == (8, 2, 1)
    assert args.sequence_parallel and args.use_distributed_optimizer and args.bf16
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (1, 64, 4096)
    assert not args.use_tp_pp_dp_mapping and not args.use_megatron_fsdp
    assert args.recompute_granularity is None
    assert "Megatron-LM cannot express this rank map" in _unwrapped(text)


def test_megatron_tp_pp_dp_order_fsdp_and_full_recompute(tmp_path: Path) -> None:
    model, cluster = model_preset("llama3-8b"), mixed_cluster()
    layout = Layout(tp=4, pp=2, dp=2, vpp=2, zero_stage=3, recompute="full",
                    sequence_parallel=True)
    p = plan(model, cluster, [candidate(model, cluster, JOB, layout,
                                        order=("tp", "cp", "pp", "dp"))])
    args, text = _megatron(p, tmp_path)
    assert args.use_tp_pp_dp_mapping
    assert args.num_virtual_stages_per_pipeline_rank == 2
    assert args.use_megatron_fsdp and args.data_parallel_sharding_strategy == "optim_grads_params"
    assert args.no_gradient_accumulation_fusion and args.use_distributed_optimizer
    assert (args.recompute_granularity, args.recompute_method, args.recompute_num_layers) == (
        "full", "uniform", 1)
    assert "(with --use-tp-pp-dp-mapping) gives exactly the plan's groups" in _unwrapped(text)


def test_megatron_zero2_is_megatron_fsdp_optim_grads(tmp_path: Path) -> None:
    """ZeRO-2 as the megatron-core stack defines it (zero_stages: 2 = Megatron-FSDP
    optim_grads), not the distributed optimizer alone (that is ZeRO-1: unsharded gradients)."""
    layout = Layout(tp=2, dp=8, zero_stage=2, sequence_parallel=True)
    args, text = _megatron(_plan(layout), tmp_path)
    assert args.use_megatron_fsdp and args.data_parallel_sharding_strategy == "optim_grads"
    assert args.ckpt_format == "fsdp_dtensor" and args.use_distributed_optimizer
    assert "Megatron-FSDP (optim_grads) shards gradients and optimizer state" in _unwrapped(text)


def test_megatron_default_order_selective_recompute_and_fp8(tmp_path: Path) -> None:
    job = Job(name="fp8-job", seq_len=4096, global_batch_size=64, precision="fp8")
    layout = Layout(tp=2, dp=8, zero_stage=1, recompute="selective", sequence_parallel=True)
    args, text = _megatron(_plan(layout, job=job), tmp_path)
    assert args.recompute_granularity == "selective" and args.recompute_method is None
    assert args.fp8_format == "hybrid"
    assert not args.use_tp_pp_dp_mapping
    assert "rank order tp-cp-dp-pp gives exactly" in _unwrapped(text)


def test_fp8_plans_say_deepspeed_json_cannot_switch_fp8_on() -> None:
    """DeepSpeed 0.19.8's config has bf16, fp16 and torch_autocast sections, no FP8 one
    (deepspeed/runtime/constants.py): an FP8 plan's deepspeed.json trains in bf16 unless the
    model's layers run FP8, and the README says so; a BF16 plan's says nothing of it."""
    layout = Layout(tp=2, dp=8, zero_stage=1, sequence_parallel=True)
    fp8 = _files(_plan(layout, job=Job(name="fp8", seq_len=4096, global_batch_size=64,
                                       precision="fp8")))
    assert json.loads(fp8["deepspeed.json"])["bf16"] == {"enabled": True}
    assert "fp8" not in fp8["deepspeed.json"].lower()
    assert "deepspeed.json cannot switch on" in " ".join(fp8["README.md"].split())
    bf16 = _files(_plan(layout, job=Job(name="bf16", seq_len=4096, global_batch_size=64)))
    assert "cannot switch on" not in bf16["README.md"]


def test_megatron_pp1_prefers_the_default_order(tmp_path: Path) -> None:
    # With pp=1 both Megatron orders give the same groups: no mapping flag is needed.
    args, _ = _megatron(_plan(Layout(tp=2, dp=8), order=("tp", "cp", "pp", "dp")), tmp_path)
    assert not args.use_tp_pp_dp_mapping and not args.use_distributed_optimizer


def _check_keys(doc: dict[str, Any], spec: dict[str, Any], where: str) -> None:
    for key, value in doc.items():
        assert key in spec, f"undocumented key {where}.{key}"
        kind = spec[key]
        if isinstance(kind, dict):
            _check_keys(value, kind, f"{where}.{key}")
        elif isinstance(kind, list):
            assert value in kind, f"{where}.{key} = {value!r} not in {kind}"
        elif kind == "list[str]":
            assert isinstance(value, list) and all(isinstance(v, str) for v in value), where
        elif kind == "list[list[str]]":
            assert isinstance(value, list) and all(
                isinstance(c, list) and all(isinstance(v, str) for v in c) for c in value), where
        else:
            expected = {"int": int, "str": str, "bool": bool, "float": (int, float)}[kind]
            assert isinstance(value, expected), f"{where}.{key} = {value!r} is not {kind}"
            if kind == "int":
                assert not isinstance(value, bool)


def _titan(p: Plan) -> tuple[dict[str, Any], str]:
    text = _files(p)["torchtitan.toml"]
    doc = tomllib.loads(text)
    _check_keys(doc, KEYS["torchtitan"]["sections"], "torchtitan")
    par = doc["parallelism"]
    # torchtitan's ParallelDims check (docs/sources.md 7.2): the degrees multiply to the world.
    world = p.candidates[0].layout.num_gpus
    assert (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
            * par["context_parallel_degree"] * par["tensor_parallel_degree"]
            * par["pipeline_parallel_degree"]) == world
    return doc, _unwrapped(text)


@pytest.mark.parametrize(("zero", "replicate", "shard", "reshard"),
                         [(0, 8, 1, "default"), (1, 1, 8, "never"), (3, 1, 8, "default")])
def test_torchtitan_data_parallel_by_zero_stage(zero: int, replicate: int, shard: int,
                                                reshard: str) -> None:
    doc, _ = _titan(_plan(Layout(tp=2, dp=8, zero_stage=zero, recompute="selective")))
    par = doc["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
            par["fsdp_reshard_after_forward"]) == (replicate, shard, reshard)
    assert doc["training"] == {"global_batch_size": 64, "local_batch_size": 1, "seq_len": 4096}
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "pipeline_parallel_schedule" not in par


def test_torchtitan_pipeline_batches_and_order_note() -> None:
    layout = Layout(tp=2, pp=2, dp=4, vpp=2, micro_batch_size=2, zero_stage=1, recompute="full")
    doc, text = _titan(_plan(layout))
    par, training = doc["parallelism"], doc["training"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    # One schedule runs every microbatch of the step: 64 / (dp=4 x mbs=2) = 8 microbatches.
    assert training["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == 8
    assert training["local_batch_size"] * par["data_parallel_shard_degree"] == 64
    assert doc["activation_checkpoint"] == {"mode": "full"}
    assert "torchtitan's rank order tp-cp-dp-pp gives exactly" in text
    _, other = _titan(_plan(layout, order=("tp", "cp", "pp", "dp")))
    assert "torchtitan cannot express this rank map" in other


def test_torchtitan_moe_keys() -> None:
    doc, text = _titan(plan_2x4_moe_remapped())
    par = doc["parallelism"]
    assert (par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]) == (2, 1)
    assert (par["context_parallel_degree"], par["tensor_parallel_degree"]) == (2, 2)
    assert "torchtitan cannot express this rank map" in text


@pytest.mark.parametrize("p", [plan_2x2_tp_intra(), plan_2x4_moe_remapped(),
                               _plan(Layout(tp=4, pp=2, dp=2, micro_batch_size=2, zero_stage=1)),
                               _plan(Layout(dp=16, micro_batch_size=2, zero_stage=3))])
def test_deepspeed_json(p: Plan) -> None:
    doc = json.loads(_files(p)["deepspeed.json"])
    _check_keys(doc, KEYS["deepspeed"]["keys"], "deepspeed")
    layout = p.candidates[0].layout
    # DeepSpeed asserts train_batch_size == micro x accumulation x data-parallel size (7.1).
    assert (doc["train_micro_batch_size_per_gpu"] * doc["gradient_accumulation_steps"]
            * layout.dp) == p.job.global_batch_size
    # It reads the data-parallel size from the mpu, or the whole world without one: a stated
    # train_batch_size fails a plain deepspeed.initialize unless dp is the world.
    assert ("train_batch_size" in doc) == (layout.dp == layout.num_gpus)
    assert doc.get("train_batch_size", p.job.global_batch_size) == p.job.global_batch_size
    assert doc["zero_optimization"]["stage"] == layout.zero_stage
    assert doc["bf16"] == {"enabled": True}


def _uneven(stages: list[int], vpp: int = 1) -> Plan:
    p = _plan(Layout(tp=2, pp=len(stages), dp=8 // len(stages), vpp=vpp, zero_stage=1))
    return p.model_copy(update={"candidates": [p.candidates[0].model_copy(
        update={"stage_layers": stages})]})


@pytest.mark.parametrize(
    ("stages", "flags"),
    [
        ([14, 18], {"decoder_first_pipeline_num_layers": 14,
                    "decoder_last_pipeline_num_layers": 18}),
        ([6, 9, 9, 8], {"decoder_first_pipeline_num_layers": 6,
                        "decoder_last_pipeline_num_layers": 8}),
        ([9, 9, 9, 5], {"decoder_first_pipeline_num_layers": None,
                        "decoder_last_pipeline_num_layers": 5}),
        ([6, 10, 8, 8], {"pipeline_model_parallel_layout": "Et*6|t*10|t*8|t*8L"}),
        ([8, 8, 8, 8], {"decoder_first_pipeline_num_layers": None,
                        "pipeline_model_parallel_layout": None}),
    ],
)  # fmt: skip
def test_uneven_pipeline_split(tmp_path: Path, stages: list[int], flags: dict[str, Any]) -> None:
    p = _uneven(stages)
    args, _ = _megatron(p, tmp_path)
    for name, value in flags.items():
        assert getattr(args, name) == value, name
    doc, _ = _titan(p)
    chunks = doc["parallelism"].get("module_fqns_per_model_part")
    if len(set(stages)) == 1:
        assert chunks is None  # even: pipeline_parallel_layers_per_stage
    else:
        # One chunk per stage holding exactly its layers; embedding first, norm and head last.
        assert [sum(m.startswith("layers.") for m in c) for c in chunks] == stages
        assert chunks[0][0] == "tok_embeddings" and chunks[-1][-2:] == ["norm", "output"]
        layers = [m for c in chunks for m in c if m.startswith("layers.")]
        assert layers == [f"layers.{i}" for i in range(sum(stages))]
    assert "pipeline_parallel_split_points" not in doc["parallelism"]  # 0.2.x refuses it


def test_uneven_split_with_virtual_stages_is_one_layout_segment_per_virtual_stage(
        tmp_path: Path) -> None:
    # 32 layers on pp=2 x vpp=2, split unevenly by the layout's own per-virtual-stage counts.
    p = _plan(Layout(tp=2, pp=2, dp=4, vpp=2, zero_stage=1, stage_layers=(7, 9, 9, 7)))
    args, _ = _megatron(p, tmp_path)
    split = p.candidates[0].layout.pipeline_split(p.model.num_layers)
    assert split.chunks == (7, 9, 9, 7)
    assert args.pipeline_model_parallel_layout == split.megatron_layout == "Et*7|t*9|t*9|t*7L"
    # Megatron takes the layout or --num-virtual-stages-per-pipeline-rank, not both.
    assert args.num_virtual_stages_per_pipeline_rank is None


def test_bad_stage_layers_are_rejected() -> None:
    with pytest.raises(PlacerError, match="stage_layers.*add up to num_layers=32"):
        launch_files(_uneven([14, 17]))
    with pytest.raises(PlacerError, match=r"one layer count per stage \(pp=2\)"):
        p = _uneven([14, 18])
        bad = p.candidates[0].model_copy(update={"stage_layers": [10, 10, 12]})
        launch_files(p.model_copy(update={"candidates": [bad]}))


def test_deepspeed_pipeline_zero3_is_refused_with_the_reason() -> None:
    files = _files(_plan(Layout(tp=4, pp=2, dp=2, zero_stage=3)))
    assert "deepspeed.json" not in files
    assert ("deepspeed.json not written: DeepSpeed 0.19 pipeline engine supports ZeRO stage 0 "
            "or 1 only") in files["README.md"]


def test_layout_knobs_reach_megatron(tmp_path: Path) -> None:
    layout = Layout(tp=2, dp=8, zero_stage=1, dp_shard=4, recompute="selective",
                    recompute_modules=("core_attn", "mlp"), offload_layers=2)
    args, _ = _megatron(_plan(layout), tmp_path)
    assert args.recompute_modules == ["core_attn", "mlp"]
    assert args.cpu_offloading_num_layers == 2
    assert args.num_distributed_optimizer_instances == 2  # 8 dp ranks, shards of 4
    full = Layout(tp=2, dp=8, recompute="full", recompute_layers=3)
    args, _ = _megatron(_plan(full), tmp_path)
    assert (args.recompute_method, args.recompute_num_layers) == ("block", 3)


def test_layout_knobs_reach_torchtitan_and_refusals_say_why() -> None:
    layout = Layout(tp=2, pp=2, dp=4, vpp=2, zero_stage=3, dp_shard=2, schedule="zbv",
                    reshard_after_forward=True, recompute="op")
    files = _files(_plan(layout))
    doc = tomllib.loads(files["torchtitan.toml"])
    par = doc["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (2, 2)
    assert par["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    assert par["fsdp_reshard_after_forward"] == "always"
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    # Megatron-LM has neither the ZBV schedule nor per-op recomputation: refused, with why.
    assert "megatron_args.sh" not in files
    readme = files["README.md"]
    assert "megatron_args.sh not written: Megatron-LM 0.16 runs the 1f1b/interleaved" in readme
    assert "no per-op selective recomputation" in readme
    offload = _files(_plan(Layout(tp=2, dp=8, offload_layers=1)))
    assert "torchtitan.toml" not in offload and "no activation offloading" in offload["README.md"]


def _runtime_job(**runtime: Any) -> Job:
    return Job(name="runtime-job", seq_len=4096, global_batch_size=64,
               precision=runtime.pop("precision", "bf16"), runtime=Runtime(**runtime))


def test_megatron_runs_the_overlaps_the_estimate_assumes(tmp_path: Path) -> None:
    """placer's generic defaults (no stack: CostOptions) overlap gradient reduction and the
    parameter gather; Megatron defaults both off (core_v0.16.1 arguments.py L2243, L2264)."""
    args, _ = _megatron(_plan(Layout(tp=2, dp=8, zero_stage=1, sequence_parallel=True)),
                        tmp_path)
    assert args.overlap_grad_reduce and args.overlap_param_gather
    assert not (args.tp_comm_overlap or args.grad_reduce_in_bf16 or args.fp8_param_gather)
    assert args.moe_token_dispatcher_type is None  # dense model: no dispatcher flag
    # zero=0: no parameter gather to overlap (Megatron asserts the distributed optimizer)
    args, text = _megatron(_plan(Layout(tp=2, dp=8)), tmp_path)
    assert args.overlap_grad_reduce and not args.overlap_param_gather
    assert "not written" not in _unwrapped(text)


def test_megatron_tp_overlap_only_with_sequence_parallel(tmp_path: Path) -> None:
    job = _runtime_job(overlaps=("tp", "dp_grad"))
    args, text = _megatron(_plan(Layout(tp=2, dp=8, zero_stage=1, sequence_parallel=True),
                                 job=job), tmp_path)
    assert args.tp_comm_overlap and args.overlap_grad_reduce and not args.overlap_param_gather
    assert "--tp-comm-overlap needs Transformer Engine" in _unwrapped(text)
    args, text = _megatron(_plan(Layout(tp=2, dp=8, zero_stage=1), job=job), tmp_path)
    assert not args.tp_comm_overlap
    assert "--tp-comm-overlap needs --sequence-parallel, which the layout has off: not " \
        "written" in _unwrapped(text)


def test_megatron_param_gather_without_grad_overlap_is_a_note(tmp_path: Path) -> None:
    job = _runtime_job(overlaps=("param_gather",))
    args, text = _megatron(_plan(Layout(tp=2, dp=8, zero_stage=1, sequence_parallel=True),
                                 job=job), tmp_path)
    assert not (args.overlap_param_gather or args.overlap_grad_reduce)
    assert "--overlap-param-gather only with --overlap-grad-reduce" in _unwrapped(text)


def test_megatron_bf16_reduce_and_fp8_param_gather(tmp_path: Path) -> None:
    job = _runtime_job(grad_reduce_dtype="bf16", fp8_param_gather=True, precision="fp8")
    args, text = _megatron(_plan(Layout(tp=2, dp=8, zero_stage=1, sequence_parallel=True),
                                 job=job), tmp_path)
    assert args.grad_reduce_in_bf16 and args.fp8_param_gather and args.fp8_format == "hybrid"
    args, text = _megatron(_plan(Layout(tp=2, dp=8, sequence_parallel=True), job=job), tmp_path)
    assert args.grad_reduce_in_bf16 and not args.fp8_param_gather
    assert "--fp8-param-gather needs the distributed optimizer" in _unwrapped(text)


def _moe_plan(job: Job, layout: Layout) -> Plan:
    return _plan(layout, job=job, model="mixtral-8x7b")


def test_megatron_moe_dispatcher_and_expert_overlap(tmp_path: Path) -> None:
    # Megatron's dispatcher default is allgather (transformer_config.py L675); placer's alltoall.
    layout = Layout(tp=2, dp=8, ep=2, zero_stage=1, sequence_parallel=True)
    args, _ = _megatron(_moe_plan(JOB, layout), tmp_path)
    assert args.moe_token_dispatcher_type == "alltoall"
    assert not args.overlap_moe_expert_parallel_comm
    args, _ = _megatron(_moe_plan(_runtime_job(overlaps=("dp_grad", "ep")), layout), tmp_path)
    assert args.overlap_moe_expert_parallel_comm and args.overlap_grad_reduce
    job = _runtime_job(overlaps=("ep",), moe_dispatcher="allgather")
    args, text = _megatron(_moe_plan(job, layout.model_copy(update={"recompute": "full"})),
                           tmp_path)
    assert args.moe_token_dispatcher_type == "allgather"
    assert not args.overlap_moe_expert_parallel_comm
    assert ("refuses --overlap-moe-expert-parallel-comm with the allgather dispatcher, full "
            "recomputation: not written") in _unwrapped(text)


def test_bridge_overrides_carry_the_runtime() -> None:
    job = _runtime_job(overlaps=("tp", "dp_grad", "param_gather"), grad_reduce_dtype="bf16")
    text = _files(_plan(Layout(tp=2, dp=8, zero_stage=1, sequence_parallel=True), job=job))[
        "megatron_bridge_overrides.yaml"]
    doc = yaml.safe_load(text)
    # Instantiated by Bridge from its _target_ (a recipe's comm_overlap may be None), with TE's
    # default userbuffers config (tests/test_launch_accept_megatron.py runs Bridge on both).
    assert doc["comm_overlap"] == {
        "_target_": "megatron.bridge.training.comm_overlap.CommOverlapConfig",
        "tp_comm_overlap_cfg": None, "tp_comm_overlap": True, "overlap_grad_reduce": True,
        "overlap_param_gather": True, "overlap_moe_expert_parallel_comm": False}
    assert doc["ddp"]["overlap_grad_reduce"] and doc["ddp"]["overlap_param_gather"]
    notes = _unwrapped(text)
    assert "keeps grad_reduce_in_fp32: true" in notes
    assert "tp_comm_overlap_cfg: null is Transformer Engine's default userbuffers" in notes


def test_biased_moe_experts_by_megatron_release() -> None:
    """GPT-OSS's linears carry biases (Model.linear_bias). Megatron-LM core_v0.13.1/v0.14.0's
    TEGroupedMLP asserts add_bias_linear False (moe/experts.py L681-683, L761-763), at any ETP;
    from core_v0.15.3 it builds them (L781, L801) but refuses bias-dropout fusion with them
    (L762-764), which the file's notes tell the user to turn off. Mixtral has no biases."""
    layout = Layout(tp=2, dp=8, ep=4, zero_stage=1, sequence_parallel=True)
    gpt_oss, mixtral = _plan(layout, model="gpt-oss-120b"), _plan(layout, model="mixtral-8x7b")
    with pytest.raises(PlacerError, match="TEGroupedMLP asserts add_bias_linear False"):
        launch_bundle(gpt_oss, 0, framework_versions=("megatron=0.14",))
    assert "--no-bias-dropout-fusion" in _unwrapped(_files(gpt_oss)["megatron_args.sh"])
    ungrouped = _plan(layout, model="gpt-oss-120b", job=Job(
        name="launch-test", seq_len=4096, global_batch_size=64,
        runtime=Runtime(moe_grouped_gemm=False)))
    for accepted in (mixtral, ungrouped):
        files = launch_bundle(accepted, 0, framework_versions=("megatron=0.14",))[0]
        assert "megatron_args.sh" in [f.name for f in files]
    assert "--no-bias-dropout-fusion" not in _unwrapped(_files(mixtral)["megatron_args.sh"])
