"""megatron-core validates every example candidate's Megatron flags; its groups match rankmap.json.

megatron-core 0.16.1's ``TransformerConfig`` and ``DistributedDataParallelConfig`` run their own
checks on the flags of megatron_args.sh (with the plan's model dimensions), and its
``RankGenerator`` builds the process groups of the order the flags select. When placer says the
Megatron order realises the plan, those groups must be rankmap.json's; when it says it cannot,
they must differ. The argument rules of Megatron-LM's training/arguments.py (not in the wheel)
are placer's own version rules (placer/dialects/megatron.py), checked here as written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers_frameworks import Case, example_cases, megatron_bridge_src, need, run_worker

from placer.cost.stack_options import job_options
from placer.dialects import megatron

# Each starts the framework in its own venv over every example candidate (tests/conftest.py).
pytestmark = pytest.mark.slow

EXPERT = ("ep", "etp", "edp")


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return example_cases()


def _model(case: Case) -> dict[str, Any]:
    m = case.plan.model
    heads = m.num_attention_heads
    return {"num_layers": m.num_layers, "hidden_size": m.hidden_size,
            "num_attention_heads": heads, "ffn_hidden_size": m.ffn_hidden_size,
            "head_dim": m.head_dim or m.hidden_size // heads,
            "num_kv_heads": m.num_kv_heads or heads, "gated_mlp": m.gated_mlp,
            "expert_ffn_hidden_size": m.moe.expert_ffn_hidden_size if m.moe else None,
            "num_experts": m.moe.num_experts if m.moe else None,
            "top_k": m.moe.top_k if m.moe else None}


def test_megatron_core_accepts_the_flags_and_builds_the_plans_groups(
        cases: list[Case], tmp_path: Path) -> None:
    version = need("megatron-core")
    manifest = [{"id": c.id, "dir": str(c.folder), "model": _model(c),
                 "world_size": c.layout.num_gpus} for c in cases]
    bridge_src = megatron_bridge_src()
    if bridge_src is None and os.environ.get("CI") == "true":
        pytest.fail("Megatron-Bridge source missing under CI=true (.ci/run installs it in "
                    ".venv-frameworks/megatron-bridge)")
    results = run_worker("megatron_accept.py", [], manifest, tmp_path,
                         env={"PLACER_MEGATRON_BRIDGE_SRC": str(bridge_src)} if bridge_src
                         else None)
    same = bridge_checked = 0
    for case in cases:
        layout, job, got = case.layout, case.plan.job, results[case.id]
        assert "error" not in got, f"{case.id}: {got['error']}"
        config = got["config"]
        assert (config["tensor_model_parallel_size"], config["pipeline_model_parallel_size"],
                config["context_parallel_size"]) == (layout.tp, layout.pp, layout.cp), case.id
        assert config["virtual_pipeline_model_parallel_size"] == (
            layout.vpp if layout.vpp > 1 else None), case.id
        assert got["args"]["micro_batch_size"] == layout.micro_batch_size, case.id
        assert (got["args"]["global_batch_size"], got["args"]["seq_length"]) == (
            job.global_batch_size, job.seq_len), case.id
        ddp = got["ddp"]
        assert ddp["use_distributed_optimizer"] == (layout.zero_stage >= 1), case.id
        assert ddp["use_megatron_fsdp"] == (layout.zero_stage >= 2), case.id
        assert ddp["data_parallel_sharding_strategy"] == (
            megatron.FSDP_STRATEGY.get(layout.zero_stage, "no_shard")), case.id
        # What the cost model priced is what megatron-core's configs run, or the file says why
        # not (a comment line naming the flag).
        options, text = job_options(job), (case.folder / "megatron_args.sh").read_text()
        comments = " ".join(line.lstrip("# ") for line in text.splitlines()
                            if line.startswith("#"))
        assert ddp["overlap_grad_reduce"] == options.dp_comm_overlap, case.id
        if options.param_gather_overlap and layout.zero_stage >= 1:
            assert ddp["overlap_param_gather"] or "--overlap-param-gather" in comments, case.id
        if options.tp_comm_overlap and layout.tp > 1:
            assert config["tp_comm_overlap"] or "--tp-comm-overlap" in comments, case.id
        if options.ep_comm_overlap and layout.ep > 1:
            assert (config["overlap_moe_expert_parallel_comm"]
                    or "--overlap-moe-expert-parallel-comm" in comments), case.id
        if case.plan.model.moe is not None:
            assert config["moe_token_dispatcher_type"] == options.moe_dispatcher, case.id
        assert ddp["grad_reduce_in_fp32"] == (job.optimizer.grad_bytes != 2), case.id
        if layout.zero_stage >= 2:
            # Megatron-FSDP's checkpoint format (arguments.py core_v0.16.1 L690).
            assert got["args"]["ckpt_format"] == megatron.FSDP_CKPT_FORMAT, case.id
        if "megatron_bridge_overrides.yaml" in case.written:
            bridge = got["bridge"]
            assert "error" not in bridge, f"{case.id}: Bridge overrides: {bridge['error']}"
            assert bridge["vpp"] == config["virtual_pipeline_model_parallel_size"], case.id
            if bridge_src:
                assert bridge["unknown"] == {}, f"{case.id}: not Bridge fields {bridge['unknown']}"
                bridge_checked += 1
        rankmap = json.loads((case.folder / "rankmap.json").read_text())
        # Expert groups exist only for MoE models (Megatron builds them for dense ones too).
        names = [k for k in rankmap["groups"] if case.plan.model.moe or k not in EXPERT]
        ours = {k: sorted(sorted(g) for g in rankmap["groups"][k]) for k in names}
        theirs = {k: got["groups"][k] for k in names}
        if "cannot express this rank map" in text:
            assert theirs != ours, f"{case.id}: placer says Megatron cannot express it"
        else:
            assert theirs == ours, case.id
            same += 1
    print(f"megatron-core {version}: {len(cases)} candidates valid, {same} with "
          "RankGenerator's groups identical to rankmap.json; Megatron-Bridge 0.3.1 field "
          f"names checked for {bridge_checked}")
    assert same > 0
