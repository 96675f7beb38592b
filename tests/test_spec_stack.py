"""Stack presets: each loads, cites its framework source, and refuses what that framework
refuses (the rules are read from the framework sources each preset names)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from placer.cost.options import DEFAULT_OPTIONS
from placer.cost.stack_options import options_for
from placer.errors import InputError
from placer.spec import Job
from placer.spec.layout import Layout
from placer.spec.presets import model_preset
from placer.spec.stack import Condition, load_stack, stack_names, stack_problem

JOB = Job(seq_len=4096, global_batch_size=64)
# Rules on the layout alone are tested on a dense model; the MoE layouts on one without biases.
DENSE, MOE = model_preset("llama3-8b"), model_preset("mixtral-8x7b")


def test_four_presets_load_and_cite_a_commit() -> None:
    names = stack_names()
    frameworks = {load_stack(n).framework for n in names}
    assert {"megatron", "torchtitan", "deepspeed", "fsdp2"} <= frameworks
    for name in names:
        stack = load_stack(name)
        assert stack.name == name
        assert "@" in stack.source and len(stack.source.split("@")[1]) == 40  # a full commit
        for rule in stack.rules:
            assert "@" in rule.source and rule.why


def test_bare_framework_name_takes_the_newest_preset() -> None:
    assert load_stack("megatron-core").name.startswith("megatron-core@")


def test_unknown_stack_is_a_one_line_error() -> None:
    with pytest.raises(InputError, match="--stack"):
        load_stack("megatron-cor@0.1")


@pytest.mark.parametrize(("stack", "layout", "rule"), [
    # deepspeed/runtime/pipe/engine.py:77
    ("deepspeed", "pp=4,dp=2,zero=2", "pipeline-engine-refuses-zero-2-3"),
    ("deepspeed", "pp=4,dp=2,zero=3", "pipeline-engine-refuses-zero-2-3"),
    # Megatron transformer_config.py: CPU offloading without PP, without recomputation
    ("megatron-core", "pp=2,dp=4,offload=1", "cpu-offloading-without-pp"),
    ("megatron-core", "dp=8,offload=1,recompute=full", "cpu-offloading-without-recompute"),
    # torchtitan pipeline_parallel.py: multi-stage schedules need two stages per rank
    ("torchtitan", "pp=4,dp=2,schedule=zb1p", "multi-stage-schedule-needs-two-stages"),
])
def test_stack_rules_refuse_what_the_framework_refuses(stack: str, layout: str,
                                                        rule: str) -> None:
    problem = stack_problem(Layout.parse(layout), load_stack(stack), DENSE)
    assert problem is not None and problem[0] == f"stack rule {rule}"


@pytest.mark.parametrize(("model", "layout", "refused"), [
    # megatron-core transformer_config.py: "Bias in Moe is only supported when ETP==1"
    ("gpt-oss-120b", "tp=2,dp=4,ep=4,etp=2", True),  # GPT-OSS's linears carry biases
    ("gpt-oss-120b", "tp=2,dp=4,ep=4,etp=1", False),
    ("mixtral-8x7b", "tp=2,dp=4,ep=4,etp=2", False),  # Mixtral's have none
])
def test_megatron_refuses_expert_tp_with_biased_moe_linears(model: str, layout: str,
                                                             refused: bool) -> None:
    problem = stack_problem(Layout.parse(layout), load_stack("megatron-core"), model_preset(model))
    if refused:
        assert problem is not None and problem[0] == "stack rule moe-bias-needs-etp-1"
        assert "Bias in Moe is only supported when ETP==1" in problem[2]
        assert "transformer_config.py" in problem[2] and "linear_bias: false" in problem[2]
    else:
        assert problem is None


def test_a_condition_reads_the_model_or_the_layout() -> None:
    bias = Condition.parse("bias=on")
    layout = Layout.parse("dp=8")
    assert bias.holds(layout, model_preset("gpt-oss-120b"))
    assert not bias.holds(layout, MOE)
    with pytest.raises(ValueError, match="with a key from .*bias"):
        Condition.parse("biases=on")


@pytest.mark.parametrize(("stack", "layout", "field"), [
    ("deepspeed", "pp=4,dp=1,cp=2", "layout.cp"),  # no context parallelism
    ("deepspeed", "pp=4,dp=1,vpp=2", "layout.vpp"),  # one stage per rank
    ("torchtitan", "dp=8,recompute=selective", "layout.recompute"),  # op-level SAC, not modules
    ("torchtitan", "dp=8,zero=1", "layout.zero_stage"),  # FSDP2: no ZeRO-1
    ("megatron-core", "pp=4,dp=2,vpp=2,schedule=zbv", "layout.schedule"),  # no ZB-V in core
    ("megatron-core", "dp=8,zero=3,reshard=off", "layout.reshard_after_forward"),
])
def test_stack_refuses_knobs_it_lacks(stack: str, layout: str, field: str) -> None:
    problem = stack_problem(Layout.parse(layout), load_stack(stack), DENSE)
    assert problem is not None and problem[0] == field
    assert load_stack(stack).name in problem[2]


@pytest.mark.parametrize(("stack", "layout"), [
    ("deepspeed", "pp=4,dp=2,zero=1"),
    ("megatron-core", "tp=8,pp=8,cp=2,vpp=8,emb=on,loss=on,sp=on,dp=8,zero=1"),
    ("megatron-core", "tp=2,pp=8,ep=32,vpp=4,dp=8,zero=1,recompute=selective,rmodules=moe_act"),
    ("torchtitan", "pp=8,vpp=2,schedule=zbv,dp=8,zero=3,recompute=op"),
    ("nemo-automodel", "dp=8,zero=3,shard=4,reshard=off"),
    ("megatron-core", "dp=1,zero=1"),  # distributed optimizer on one rank: a no-op, accepted
])
def test_stack_runs_its_published_combinations(stack: str, layout: str) -> None:
    model = MOE if Layout.parse(layout).ep > 1 else DENSE
    assert stack_problem(Layout.parse(layout), load_stack(stack), model) is None


def test_stack_defaults_reach_the_cost_options() -> None:
    megatron = options_for(JOB, load_stack("megatron-core"))
    assert not megatron.tp_comm_overlap and megatron.dp_comm_overlap
    deepspeed = options_for(JOB, load_stack("deepspeed"))
    assert not deepspeed.dp_overlap_under_pp
    forced = options_for(Job(seq_len=4096, global_batch_size=64,
                             runtime={"overlaps": ["tp", "dp_grad"]}), load_stack("megatron-core"))
    assert forced.tp_comm_overlap and not forced.param_gather_overlap
    # No stack: the defaults, with the allocator as placer's env.sh launches it.
    assert options_for(JOB, None) == replace(DEFAULT_OPTIONS, expandable_segments=True)


def test_grad_reduce_in_bf16_and_fp8_param_gather_set_optimizer_bytes() -> None:
    job = Job(seq_len=8192, global_batch_size=128, precision="fp8",
              runtime={"grad_reduce_dtype": "bf16", "fp8_param_gather": True})
    assert (job.optimizer.grad_bytes, job.optimizer.param_bytes) == (2, 1)
    with pytest.raises(ValueError, match="precision: fp8"):
        Job(seq_len=8, global_batch_size=1, runtime={"fp8_param_gather": True})
    with pytest.raises(ValueError, match="contradicts"):
        Job(seq_len=8, global_batch_size=1, optimizer={"grad_bytes": 4},
            runtime={"grad_reduce_dtype": "bf16"})


@pytest.mark.parametrize(("stack", "runtime", "field"), [
    ("deepspeed", {"overlaps": ["tp"]}, "runtime.overlaps"),  # no TP-GEMM overlap
    ("torchtitan", {"fp8_recipe": "delayed"}, "runtime.fp8_recipe"),  # tensorwise, mxfp8
    ("deepspeed", {"moe_dispatcher": "flex"}, "runtime.moe_dispatcher"),
])
def test_job_runtime_must_be_offered_by_its_stack(stack: str, runtime: dict[str, object],
                                                  field: str) -> None:
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        Job(seq_len=4096, global_batch_size=64, precision="fp8", stack=stack, runtime=runtime)
    Job(seq_len=4096, global_batch_size=64, precision="fp8", runtime=runtime)  # no stack: any


@pytest.mark.parametrize("text", [
    "tp=2,pp=8,dp=4,cp=1,vpp=4,mbs=1,zero=1,recompute=selective,sp=on,emb=on,loss=on,"
    "rmodules=core_attn+moe_act",
    "tp=1,pp=16,dp=4,cp=1,vpp=2,mbs=1,zero=1,recompute=none,sp=off,pplayout=Et|(tt|)*30,L",
    "tp=1,pp=4,dp=2,cp=1,vpp=2,mbs=1,zero=3,recompute=full,sp=off,schedule=zbv,stages=2/2/2/2/2/"
    "2/2/2,rlayers=1,shard=2,reshard=on",
    "tp=1,pp=1,dp=8,cp=1,vpp=1,mbs=2,zero=0,recompute=none,sp=off,offload=4",
    # FSDP kept gathered after the forward (torchtitan's "never"): False is not the default (None)
    "tp=1,pp=2,dp=4,cp=1,vpp=1,mbs=1,zero=3,recompute=none,sp=off,reshard=off",
])
def test_new_layout_knobs_round_trip(text: str) -> None:
    layout = Layout.parse(text)
    assert layout.compact() == text
    assert Layout.parse(layout.compact()) == layout


def test_stack_presets_validate_against_the_stack_schema(
        capsys: pytest.CaptureFixture[str]) -> None:
    import json
    from importlib import resources

    import jsonschema
    from helpers_cli import cli

    from placer.spec.presets import load_yaml

    code, out, err = cli(["schema", "stack"], capsys)
    assert code == 0, err
    schema = json.loads(out)
    folder = resources.files("placer.spec").joinpath("presets", "stacks")
    for name in stack_names():
        jsonschema.validate(load_yaml(folder.joinpath(f"{name}.yaml").read_text()), schema)
