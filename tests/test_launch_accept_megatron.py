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
import yaml
from helpers_frameworks import (
    Case,
    example_cases,
    megatron_bridge_src,
    missing,
    need,
    run_worker,
    write_case,
)
from helpers_launch import candidate, plan, small_cluster

from placer.cost.stack_options import job_options
from placer.dialects import megatron
from placer.launch import launch_bundle, placement_of
from placer.launch.frameworks import render_megatron_sh
from placer.spec import Job, Layout
from placer.spec.presets import model_preset
from placer.spec.runtime import Runtime
from placer.spec.stack import load_stack, stack_problem

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
            "top_k": m.moe.top_k if m.moe else None,
            # The user's model flag (--disable-bias-linear when false), which megatron-core
            # checks against expert TP ("Bias in Moe is only supported when ETP==1"): the
            # model's own field (Model.linear_bias: GPT-OSS on, Mixtral/Qwen3/DeepSeek off).
            "add_bias_linear": m.linear_bias}


def test_megatron_core_accepts_the_flags_and_builds_the_plans_groups(
        cases: list[Case], tmp_path: Path) -> None:
    version = need("megatron-core")
    for case in cases:
        if "megatron_args.sh" not in case.written:  # refused only for megatron-core's MoE bias
            assert case.layout.etp > 1 and case.plan.model.linear_bias, case.id
            assert any(f"stack rule {megatron.MOE_BIAS_RULE}" in r for r in case.refused), case.id
    cases = [c for c in cases if "megatron_args.sh" in c.written]
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


# Bridge 0.3.1's own dependencies for the YAML path (its METADATA: hydra-core >1.3,<=1.3.2,
# omegaconf >=2.3.0; regex for training/tokenizers, which training/config.py imports).
BRIDGE_YAML_PACKAGES = ("hydra-core", "omegaconf", "regex")


def bridge_applies(cases: list[Case], tmp_path: Path) -> None:
    """Megatron-Bridge 0.3.1's own YAML path (tests/frameworks/bridge_apply.py:
    process_config_with_overrides, then runtime_config_update) runs every candidate's
    megatron_bridge_overrides.yaml against a recipe whose comm_overlap is None and one with a
    CommOverlapConfig carrying a tuned userbuffers config: no error; every key the file sets is
    on a section of the container (a dataclass, never the plain dict a mapping becomes on a None
    field) with the file's value after the merge and after the run's setup; the overlaps the run
    is left with are the file's."""
    need("megatron-core")
    for package in BRIDGE_YAML_PACKAGES:
        need(package)
    bridge_src = megatron_bridge_src()
    if bridge_src is None:
        missing("no Megatron-Bridge source (.ci/run unpacks it in .venv-frameworks/"
                "megatron-bridge)")
    written = [c for c in cases if "megatron_bridge_overrides.yaml" in c.written]
    assert written, "no candidate has a Megatron-Bridge file"
    manifest = [{"id": c.id, "dir": str(c.folder), "model": _model(c),
                 "world_size": c.layout.num_gpus,
                 "gpu": c.plan.cluster.node_types[0].gpu.name} for c in written]
    results = run_worker("bridge_apply.py", [], manifest, tmp_path,
                         env={"PLACER_MEGATRON_BRIDGE_SRC": str(bridge_src)})
    assert sorted(results) == sorted(c.id for c in written)
    for case in written:
        doc = yaml.safe_load((case.folder / "megatron_bridge_overrides.yaml").read_text())
        for recipe in ("none", "userbuffers"):
            got = results[case.id][recipe]
            where = f"{case.id}, recipe with comm_overlap {recipe}"
            assert "error" not in got, f"{where}: {got['error']}\n{got['where']}"
            assert not [w for w in got["warnings"] if "Skipping" in w or "instantiate" in w], (
                where, got["warnings"])
            for stage in ("merged", "final"):
                held = got[stage]
                wrong = {}
                for section, keys in doc.items():
                    if not isinstance(keys, dict):  # a named mixed-precision recipe
                        want = keys if stage == "merged" else "<MixedPrecisionConfig>"
                        if held[section] != want:
                            wrong[section] = (want, held[section])
                        continue
                    if held[f"{section}:type"] == "dict":
                        wrong[section] = "a plain dict, not the section's dataclass"
                    want_keys = dict(keys)
                    if section == "model" and stage == "final":
                        # megatron-core derives it from pipeline_model_parallel_layout, which
                        # placer writes with it null: the run's must be the plan's.
                        want_keys["virtual_pipeline_model_parallel_size"] = (
                            case.layout.vpp if case.layout.vpp > 1 else None)
                    wrong.update({f"{section}.{k}": (v, held[f"{section}.{k}"])
                                  for k, v in want_keys.items()
                                  if k != "_target_" and held[f"{section}.{k}"] != v})
                assert wrong == {}, f"{where}, {stage}: written -> held {wrong}"
            overlap = doc["comm_overlap"]
            assert got["effective"] == {
                "model.tp_comm_overlap": overlap["tp_comm_overlap"],
                "model.overlap_moe_expert_parallel_comm":
                    overlap["overlap_moe_expert_parallel_comm"],
                "ddp.overlap_grad_reduce": doc["ddp"]["overlap_grad_reduce"],
                "ddp.overlap_param_gather": doc["ddp"]["overlap_param_gather"]}, where
    print(f"Megatron-Bridge 0.3.1: {len(written)} overrides files merged and set up on both "
          "kinds of recipe")


def test_megatron_core_refuses_expert_tp_with_biases_where_the_stack_rule_does(
        tmp_path: Path) -> None:
    """megatron-core's TransformerConfig is the truth for the stack rule moe-bias-needs-etp-1:
    GPT-OSS-120B (linears with biases) and Mixtral-8x7B (none) at ETP 1 and 2, on 2 x 8 GPUs;
    the flags are rendered as the Megatron dialect writes them (render_megatron_sh, past the
    dialect's own refusal). megatron-core refuses exactly the layouts the megatron-core stack
    refuses, with its assert; the dialect writes no Megatron file for those."""
    version = need("megatron-core")
    stack = load_stack("megatron-core")
    job = Job(name="moe-bias", seq_len=4096, global_batch_size=64)
    cluster, manifest, verdicts = small_cluster(2, 8), [], {}
    for name in ("gpt-oss-120b", "mixtral-8x7b"):
        m = model_preset(name)
        for etp in (1, 2):
            layout = Layout(tp=2, dp=8, ep=4, etp=etp, zero_stage=1, sequence_parallel=True)
            p = plan(m, cluster, [candidate(m, cluster, job, layout)], job=job)
            case_id = f"{name}-etp{etp}"
            folder = tmp_path / case_id
            folder.mkdir()
            (folder / megatron.FILE).write_text(render_megatron_sh(placement_of(p, 0)))
            files, refused = launch_bundle(p, 0)
            rule = stack_problem(layout, stack, m)
            verdicts[case_id] = (rule is not None, megatron.FILE not in [f.name for f in files],
                                 refused)
            manifest.append({"id": case_id, "dir": str(folder), "world_size": 16,
                             "model": _model(Case(case_id, p, 0, folder, (), ()))})
    results = run_worker("megatron_accept.py", [], manifest, tmp_path)
    for case_id, (rule, not_written, refused) in verdicts.items():
        error = results[case_id].get("error", "")
        megatron_refuses = "Bias in Moe is only supported when ETP==1" in error
        assert megatron_refuses or not error, f"{case_id}: {error}"
        assert rule == megatron_refuses == not_written, (case_id, rule, error, refused)
        if not_written:
            assert any(f"stack rule {megatron.MOE_BIAS_RULE}" in r.line() for r in refused)
    assert [k for k, v in verdicts.items() if v[0]] == ["gpt-oss-120b-etp2"]
    print(f"megatron-core {version}: refuses GPT-OSS at ETP 2 ('Bias in Moe'), as the stack rule")


def overlap_cases(root: Path) -> list[Case]:
    """Two candidates whose jobs overlap TP and expert communication (no example does): Llama-3
    8B TP2 PP2 VPP2 with SP (TP overlap, so Bridge's setup() takes the userbuffers-config
    branch) and Mixtral-8x7B TP2 EP2 (the expert all-to-all overlap, which setup() asserts the
    model's dispatcher, precision and recomputation for)."""
    out = []
    for name, model, layout, overlaps in (
            ("tp-overlap", "llama3-8b", Layout(tp=2, pp=2, vpp=2, dp=4, zero_stage=1,
                                                sequence_parallel=True),
             ("tp", "dp_grad", "param_gather")),
            ("ep-overlap", "mixtral-8x7b", Layout(tp=2, dp=8, ep=2, zero_stage=1,
                                                   sequence_parallel=True),
             ("tp", "dp_grad", "param_gather", "ep"))):
        job = Job(name=name, seq_len=4096, global_batch_size=64, runtime=Runtime(overlaps=overlaps))
        m, cluster = model_preset(model), small_cluster(2, 8)
        p = plan(m, cluster, [candidate(m, cluster, job, layout)], job=job)
        out.append(write_case(root / name, name, p))
    return out


def test_bridge_runs_the_overrides_on_recipes_with_and_without_comm_overlap(
        cases: list[Case], tmp_path: Path) -> None:
    extra = overlap_cases(tmp_path)
    for case in extra:
        doc = yaml.safe_load((case.folder / "megatron_bridge_overrides.yaml").read_text())
        assert doc["comm_overlap"]["tp_comm_overlap"], case.id
    assert doc["comm_overlap"]["overlap_moe_expert_parallel_comm"]
    bridge_applies(cases + extra, tmp_path)


def test_fp8_recipes_reach_megatron_core_and_bridge(tmp_path: Path) -> None:
    """The job's FP8 recipe is what megatron-core's TransformerConfig gets from megatron_args.sh
    (--fp8-format, --fp8-recipe) and what the Megatron-Bridge recipe named in the overrides
    sets (read from Bridge's own mixed_precision.py); without a recipe, Megatron's default."""
    need("megatron-core")
    src = megatron_bridge_src()
    model, cluster = model_preset("llama3-8b"), small_cluster(1, 8, gpu="B200")
    layout = Layout(tp=2, dp=4, zero_stage=1, sequence_parallel=True)
    cases, manifest = {}, []
    for recipe in (None, *megatron.FP8_RECIPES):
        job = Job(name=f"fp8-{recipe}", seq_len=4096, global_batch_size=64, precision="fp8",
                  runtime=Runtime(fp8_recipe=recipe))
        case = write_case(tmp_path / str(recipe), str(recipe),
                          plan(model, cluster, [candidate(model, cluster, job, layout)], job=job))
        assert {megatron.FILE, "megatron_bridge_overrides.yaml"} <= set(case.written)
        cases[str(recipe)] = recipe
        manifest.append({"id": str(recipe), "dir": str(case.folder), "world_size": 8,
                         "model": _model(case)})
    env = {"PLACER_MEGATRON_BRIDGE_SRC": str(src)} if src else None
    results = run_worker("megatron_accept.py", [], manifest, tmp_path, env=env)
    for case_id, recipe in cases.items():
        got = results[case_id]
        assert "error" not in got, (case_id, got["error"])
        assert got["config"]["fp8_recipe"] == (recipe or "delayed"), case_id
        assert got["config"]["fp8"] == ("e4m3" if recipe == "mxfp8" else "hybrid"), case_id
        if src is None:
            continue
        bridge = got["bridge"]
        assert "error" not in bridge and not bridge.get("unknown"), (case_id, bridge)
        assert bridge["mixed_precision_settings"]["fp8_recipe"] == (recipe or "delayed")
    if src is None:
        missing("no Megatron-Bridge source: its recipes' FP8 settings were not checked")


def test_bridge_recipe_table_is_bridges_own() -> None:
    """placer's table of Bridge's named mixed-precision recipes (read by check, written by
    launch) names every recipe Bridge registers, with the FP8 (or FP4) recipe its function
    sets, as Bridge's own source says."""
    import importlib.util

    from placer.dialects import megatron_bridge

    src = megatron_bridge_src()
    if src is None:
        missing("no Megatron-Bridge source (.ci/run unpacks megatron-bridge 0.3.1)")
    spec = importlib.util.spec_from_file_location(
        "megatron_accept", Path(__file__).parent / "frameworks" / "megatron_accept.py")
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    text = (src / "megatron/bridge/training/mixed_precision.py").read_text()
    registered = [line.split("def ", 1)[1].split("(", 1)[0] for line, previous in zip(
        text.splitlines()[1:], text.splitlines(), strict=False) if previous == "@register"]
    assert sorted(registered) == sorted(megatron_bridge.MIXED_PRECISION_RECIPES)
    for name, recipe in megatron_bridge.MIXED_PRECISION_RECIPES.items():
        settings = worker.recipe_settings(src, name)
        sets = (settings.get("fp4_recipe") if settings.get("fp4") else
                settings.get("fp8_recipe") if settings.get("fp8") else None)
        assert sets == recipe, (name, settings)
    for recipe, name in megatron_bridge.FP8_RECIPE_NAMES.items():
        assert megatron_bridge.MIXED_PRECISION_RECIPES[name] == (recipe or "delayed")
