"""Foundation: schemas, presets, Layout parsing, the degree rules, and Cluster bookkeeping."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import ValidationError

import placer.spec
from placer.cli import main
from placer.errors import InputError, PlacerError
from placer.spec import (
    Cluster,
    DegreeConstraint,
    Job,
    Layout,
    Model,
    layout_problem,
    pipeline_stage_layers,
    validate_layout,
)
from placer.spec.presets import (
    cluster_names,
    cluster_preset,
    gpu_names,
    gpu_preset,
    load_cluster,
    load_model,
    model_names,
    model_preset,
    read_document,
)
from placer.spec.stack import stack_names

PRESETS = Path(placer.spec.__file__).parent / "presets"
KINDS = ("cluster", "job", "layout", "model", "plan")


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    code = info.value.code if isinstance(info.value.code, int) else 0
    return code, captured.out, captured.err


def _schema(kind: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, _ = _run(["schema", kind], capsys)
    assert code == 0
    schema: dict[str, Any] = json.loads(out)
    return schema


# --- placer schema ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_schema_is_valid_json_schema(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    schema = _schema(kind, capsys)
    Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object" and schema["properties"]
    assert _schema(kind, capsys) == schema  # deterministic


def test_model_presets_validate_against_the_model_schema(
        capsys: pytest.CaptureFixture[str]) -> None:
    validator = Draft202012Validator(_schema("model", capsys))
    table = read_document(PRESETS / "models.yaml")
    for name in model_names():
        validator.validate({"name": name, **table[name]})


def test_cluster_presets_validate_against_the_cluster_schema(
        capsys: pytest.CaptureFixture[str]) -> None:
    validator = Draft202012Validator(_schema("cluster", capsys))
    for name in cluster_names():
        validator.validate(read_document(PRESETS / "clusters" / f"{name}.yaml"))
    # The GPU is a preset name in those files, or a whole GPU object.
    cluster = cluster_preset("dgx-h100").model_dump(mode="json")
    validator.validate(cluster)
    cluster["node_types"][0]["gpu"] = "H99"
    assert not validator.is_valid(cluster)


def test_job_schema_takes_constraints_as_strings_or_objects(
        capsys: pytest.CaptureFixture[str]) -> None:
    validator = Draft202012Validator(_schema("job", capsys))
    for constraints in (["tp<=8", "pp in 1,2,4"], "zero>=1",
                        [{"key": "tp", "op": "<=", "values": [8]}]):
        job = {"seq_len": 4096, "global_batch_size": 512, "constraints": constraints}
        validator.validate(job)
        Job.model_validate(job)
    assert not validator.is_valid({"seq_len": 4096})


def test_layout_schema_accepts_a_layout(capsys: pytest.CaptureFixture[str]) -> None:
    validator = Draft202012Validator(_schema("layout", capsys))
    validator.validate(Layout.parse("tp=8,pp=2,dp=4,zero=1,sp=on").model_dump(mode="json"))
    assert not validator.is_valid({"tp": 0})


def test_yaml_reads_exponent_floats_as_numbers(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("a: 300.0e9\nb: 1e9\nc: '1e9'\nd: 12\n")
    assert read_document(path) == {"a": 300e9, "b": 1e9, "c": "1e9", "d": 12}


# --- presets -----------------------------------------------------------------------------------

def test_every_preset_loads() -> None:
    assert gpu_names() and cluster_names() and model_names()
    for name in gpu_names():
        assert gpu_preset(name).name == name
    for name in model_names():
        assert load_model(name) == model_preset(name) and model_preset(name).name == name
    for name in cluster_names():
        cluster = load_cluster(name)
        assert cluster.name == name and cluster.num_gpus > 0
        assert all(t.gpu.name in gpu_names() for t in cluster.node_types)


def test_presets_command_lists_everything(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["presets", "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {"gpus": gpu_names(), "clusters": cluster_names(),
                               "models": model_names(), "stacks": stack_names()}
    code, out, _ = _run(["presets"], capsys)
    assert code == 0
    words = set(out.replace("│", " ").split())
    assert set(gpu_names()) | set(cluster_names()) | set(model_names()) <= words
    assert set(stack_names()) <= words


# --- Layout ------------------------------------------------------------------------------------

layouts = st.builds(
    Layout,
    tp=st.integers(1, 64), pp=st.integers(1, 64), dp=st.integers(1, 4096), cp=st.integers(1, 16),
    ep=st.integers(1, 256), etp=st.integers(1, 8), vpp=st.integers(1, 8),
    micro_batch_size=st.integers(1, 16), zero_stage=st.integers(0, 3),
    recompute=st.sampled_from(["none", "selective", "full"]), sequence_parallel=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(layouts)
def test_layout_parse_round_trips_compact(layout: Layout) -> None:
    assert Layout.parse(layout.compact()) == layout
    assert Layout.parse(str(layout)).compact() == layout.compact()


def test_layout_parse_forms() -> None:
    layout = Layout.parse("TP=8, pp=4, mbs=2, zero=1, recompute=selective, sp=on", num_gpus=256)
    assert (layout.tp, layout.pp, layout.dp, layout.micro_batch_size) == (8, 4, 8, 2)
    assert layout.zero_stage == 1 and layout.sequence_parallel and layout.num_gpus == 256
    assert Layout.parse("fsdp=3,sp=off").zero_stage == 3
    for text, fix in (("tp=3", "tp*pp*cp = 3"), ("tp", "key=value"), ("foo=2", "key=value"),
                      ("tp=-1", "positive integer"), ("tp=0", "positive integer"),
                      ("sp=maybe", "on or off"), ("recompute=most", "none, selective, op, full")):
        with pytest.raises(InputError, match=re.escape(fix)):
            Layout.parse(text, num_gpus=8)
    # Out-of-range degrees are one-line user errors too, never a pydantic traceback.
    for text, field in (("zero=4", "--layout.zero_stage"), ("vpp=2000", "--layout.vpp")):
        with pytest.raises(PlacerError, match=re.escape(field)):
            Layout.parse(text)


# --- layout_problem: one case per rule ---------------------------------------------------------

DENSE = Model(name="dense", num_layers=32, hidden_size=4096, num_attention_heads=32,
              num_kv_heads=8, ffn_hidden_size=14336, vocab_size=32000)
GQA48 = DENSE.model_copy(update={"num_attention_heads": 48, "hidden_size": 6144})
ODD_EXPERTS = Model.model_validate({**DENSE.model_dump(), "moe": {
    "num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1000}})
MOE = model_preset("mixtral-8x7b")
JOB = Job(seq_len=4096, global_batch_size=256)


def _job(**changes: Any) -> Job:
    return Job.model_validate({**JOB.model_dump(), **changes})


RULE_CASES = [
    # (layout, model, job, GPUs, field, words of the fix)
    ("tp=8,dp=4", DENSE, JOB, 64, "layout", "multiply to the 64 GPUs"),
    ("tp=3", DENSE, JOB, 3, "layout.tp", "num_attention_heads=32"),
    ("tp=6", GQA48, JOB, 6, "layout.tp", "num_kv_heads=8"),
    ("pp=1,vpp=2", DENSE, JOB, 1, "layout.vpp", "pp > 1"),
    ("pp=4,vpp=9", DENSE, JOB, 4, "layout.vpp", "exceed the 32 layers plus embedding and loss"),
    ("pp=33,dp=1", DENSE, JOB, 33, "layout.pp", "more stages than num_layers=32"),
    ("cp=3", DENSE, JOB, 3, "layout.cp", "seq_len=4096"),
    ("tp=1,sp=on", DENSE, JOB, 1, "layout.sequence_parallel", "tp > 1"),
    ("tp=8,sp=on", DENSE, _job(seq_len=4100), 8, "layout.tp", "seq_len=4100"),
    ("dp=4,mbs=3", DENSE, JOB, 4, "layout.micro_batch_size", "global_batch_size=256"),
    ("pp=4,vpp=2,mbs=4", DENSE, _job(global_batch_size=24), 4, "layout.vpp", "microbatches (6)"),
    ("dp=8,ep=2", DENSE, JOB, 8, "layout.ep", "no experts"),
    ("dp=6,ep=3", MOE, _job(global_batch_size=240), 6, "layout.ep", "num_experts=8"),
    ("dp=4,ep=8", MOE, JOB, 4, "layout.ep", "ep*etp=8 must divide tp*cp*dp=4"),
    ("dp=3,etp=3", ODD_EXPERTS, _job(global_batch_size=240), 3, "layout.etp", "expert_ffn"),
    ("tp=16", DENSE, _job(constraints=["tp<=8"]), 16, "layout.tp", "tp<=8"),
    ("pp=8", DENSE, _job(constraints=["pp in 1,2,4"]), 8, "layout.pp", "pp in 1,2,4"),
    ("dp=8,ep=4", MOE, _job(constraints=["ep=8"]), 8, "layout.ep", "ep=8"),
    ("dp=8", DENSE, _job(constraints=["zero>=1"]), 8, "layout.zero", "zero>=1"),
    ("dp=8", DENSE, _job(constraints=["recompute=full"]), 8, "layout.recompute", "recompute=full"),
    ("tp=2,dp=4", DENSE, _job(constraints=["sp=on"]), 8, "layout.sp", "sp=on"),
]


@pytest.mark.parametrize(("text", "model", "job", "gpus", "field", "fix"), RULE_CASES)
def test_layout_problem_catches_each_rule(text: str, model: Model, job: Job, gpus: int,
                                          field: str, fix: str) -> None:
    problem = layout_problem(Layout.parse(text), model, job, gpus)
    assert problem is not None and problem[0] == field and fix in problem[2]
    with pytest.raises(InputError, match=field):
        validate_layout(Layout.parse(text), model, job, gpus)


@pytest.mark.parametrize(("text", "model", "job", "gpus"), [
    ("tp=8,pp=4,dp=2,mbs=2,zero=1,sp=on,recompute=full", DENSE, _job(constraints=[
        "tp<=8", "pp in 1,2,4", "zero>=1", "recompute=full", "sp=on"]), 64),
    ("tp=16,dp=2", DENSE, JOB, 32),  # tp a multiple of the 8 KV heads
    ("tp=2,cp=2,dp=4,ep=8,pp=2,vpp=2", MOE, _job(constraints=["ep=8"]), 32),
    ("dp=4,etp=4", ODD_EXPERTS, JOB, 4),
])
def test_layout_problem_accepts_valid_layouts(text: str, model: Model, job: Job,
                                              gpus: int) -> None:
    assert layout_problem(Layout.parse(text), model, job, gpus) is None
    validate_layout(Layout.parse(text), model, job, gpus)


@pytest.mark.parametrize(("layers", "pp", "vpp", "split"), [
    (32, 4, 1, [8, 8, 8, 8]),
    (32, 4, 2, [8, 8, 8, 8]),
    (126, 16, 1, [7] + [8] * 14 + [7]),  # Llama 3 405B as Meta trained it
    (70, 12, 1, [5] + [6] * 10 + [5]),  # BLOOM-176B
    (9, 4, 1, [2, 2, 3, 2]),  # one extra layer: the latest middle stage
    (31, 8, 1, [3] + [4] * 7),  # every stage but the first takes one
    (61, 2, 1, [30, 31]),
    (5, 5, 1, [1] * 5),
    # Interleaved and uneven: as even as possible with the embedding and loss counted as layers
    # (34 over 6 virtual stages: 4, 6, 6 | 6, 6, 4 by rank r and r + 3).
    (32, 3, 2, [10, 12, 10]),
    (4, 5, 1, None),  # more stages than layers
])
def test_pipeline_stage_layers(layers: int, pp: int, vpp: int, split: list[int] | None) -> None:
    assert pipeline_stage_layers(layers, pp, vpp) == split
    if split is not None and vpp == 1:
        assert sum(split) == layers and max(split) - min(split) <= 1
        assert split[0] == min(split)


def test_constraint_parsing() -> None:
    assert DegreeConstraint.parse("tp<=8") == DegreeConstraint(key="tp", op="<=", values=(8,))
    assert DegreeConstraint.parse("pp in 1,2,4").values == (1, 2, 4)
    assert DegreeConstraint.parse("tp==4").op == "="
    assert str(DegreeConstraint.parse("pp in 1, 2")) == "pp in 1,2"
    assert DegreeConstraint.parse("recompute=full").allows("full")
    for bad in ("foo<=8", "tp<=x", "tp<=1,2", "recompute>=full", "sp=maybe", "tp"):
        with pytest.raises(ValueError):
            DegreeConstraint.parse(bad)
    with pytest.raises(ValidationError):
        Job(seq_len=1, global_batch_size=1, constraints=["tp<<8"])


# --- Model -------------------------------------------------------------------------------------

def test_model_rules() -> None:
    with pytest.raises(ValidationError, match="must divide num_attention_heads"):
        DENSE.model_validate({**DENSE.model_dump(), "num_kv_heads": 7})
    with pytest.raises(ValidationError, match="set head_dim"):
        DENSE.model_validate({**DENSE.model_dump(), "hidden_size": 4097})
    assert DENSE.model_validate({**DENSE.model_dump(), "hidden_size": 4097,
                                 "head_dim": 128}).attention_head_dim == 128
    with pytest.raises(ValidationError, match="top_k 9 exceeds"):
        Model.model_validate({**DENSE.model_dump(), "moe": {
            "num_experts": 8, "top_k": 9, "expert_ffn_hidden_size": 10}})
    sparse = Model.model_validate({**DENSE.model_dump(), "moe": {
        "num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 10, "first_dense_layers": 1,
        "layer_frequency": 2}})
    assert [i for i in range(8) if sparse.is_moe_layer(i)] == [1, 3, 5, 7]
    assert sparse.num_moe_layers == 16 and DENSE.num_moe_layers == 0


# --- Cluster -----------------------------------------------------------------------------------

def _cluster(**changes: Any) -> Cluster:
    return Cluster.model_validate({**cluster_preset("dgx-h100").model_dump(), **changes})


def test_seven_of_eight_healthy_gpus() -> None:
    cluster = _cluster(excluded_gpus=[{"node": 0, "gpu": 3}])
    assert cluster.num_gpus == 7 and not cluster.is_regular
    assert cluster.healthy_gpus(0) == (0, 1, 2, 4, 5, 6, 7)
    assert cluster.nodes()[0].healthy_gpus == (0, 1, 2, 4, 5, 6, 7)


def test_excluded_gpus_across_nodes_and_with_nodes() -> None:
    cluster = _cluster(pools=[{"node_type": "dgx-h100", "count": 4}],
                       excluded_gpus=[{"node": 1, "gpu": 0}, {"node": 3, "gpu": 7},
                                      {"node": 3, "gpu": 6}])
    assert cluster.num_gpus == 32 - 3
    assert cluster.healthy_gpus(3) == (0, 1, 2, 3, 4, 5)
    smaller = cluster.with_nodes(2)
    assert smaller.num_nodes == 2 and smaller.num_gpus == 15
    assert [(r.node, r.gpu) for r in smaller.excluded_gpus] == [(1, 0)]
    bigger = cluster_preset("dgx-h100").with_nodes(16)
    assert bigger.num_nodes == 16 and bigger.num_gpus == 128 and bigger.is_regular
    with pytest.raises(InputError, match="--nodes"):
        cluster.with_nodes(0)


def test_mixed_node_types_in_two_pools() -> None:
    a100 = cluster_preset("dgx-a100").node_types[0].model_dump()
    h100 = cluster_preset("dgx-h100").node_types[0].model_dump()
    cluster = Cluster.model_validate({
        "name": "mixed", "node_types": [a100, h100],
        "pools": [{"node_type": "dgx-a100", "count": 2, "hostnames": ["a0", "a1"]},
                  {"node_type": "dgx-h100", "count": 1}],
        "excluded_gpus": [{"node": 2, "gpu": 5}]})
    assert cluster.num_nodes == 3 and cluster.num_gpus == 23 and not cluster.is_regular
    assert [cluster.node_type_of(n).name for n in range(3)] == ["dgx-a100", "dgx-a100",
                                                                "dgx-h100"]
    assert [(n.index, n.hostname, len(n.healthy_gpus)) for n in cluster.nodes()] == [
        (0, "a0", 8), (1, "a1", 8), (2, None, 7)]
    with pytest.raises(InputError, match="several node pools"):
        cluster.with_nodes(4)


@pytest.mark.parametrize(("changes", "message"), [
    ({"excluded_gpus": [{"node": 1, "gpu": 0}]}, "nodes are 0..0"),
    ({"excluded_gpus": [{"node": 0, "gpu": 8}]}, "does not exist"),
    ({"excluded_gpus": [{"node": 0, "gpu": g} for g in range(8)]}, "every GPU"),
    ({"pools": [{"node_type": "dgx-h200", "count": 1}]}, "'dgx-h200' is not a node type"),
    ({"pools": [{"node_type": "dgx-h100", "count": 2, "hostnames": ["n0"]}]},
     "hostnames: 1 given for count 2"),
    ({"pools": [{"node_type": "dgx-h100", "count": 1, "hostnames": ["bad_host"]}]}, "RFC 1123"),
    ({"pools": [{"node_type": "dgx-h100", "count": -2}]}, "greater than or equal to 1"),
])
def test_cluster_rules(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _cluster(**changes)


def test_node_type_rules() -> None:
    node = cluster_preset("dgx-h100").node_types[0].model_dump()
    node["fabric"]["numa_groups"] = [[0, 1, 2, 3], [4, 5, 6, 8]]
    with pytest.raises(ValidationError, match="GPU index 8 is outside 0..7"):
        _cluster(node_types=[node])
    node = cluster_preset("dgx-h100").node_types[0].model_dump()
    node["fabric"] = {**node["fabric"], "kind": "nvlink_bridge"}
    with pytest.raises(ValidationError, match="needs nvlink_groups"):
        _cluster(node_types=[node])
    with pytest.raises(ValidationError, match="name 'dgx-h100' is used twice"):
        _cluster(node_types=[cluster_preset("dgx-h100").node_types[0].model_dump()] * 2)


def test_gpu_peaks_and_capacity() -> None:
    a100, b200 = gpu_preset("A100-80GB"), gpu_preset("B200")
    assert a100.peak_flops("fp8") == a100.bf16_flops  # no FP8 on Ampere
    assert b200.peak_flops("fp8") == b200.fp8_flops
    limited = b200.model_copy(update={"usable_memory_bytes": b200.memory_bytes // 2})
    assert limited.capacity_bytes == limited.usable_memory_bytes < limited.memory_bytes
    assert b200.capacity_bytes == b200.memory_bytes  # no usable figure: nvidia-smi's total
    with pytest.raises(PlacerError):
        load_cluster("no-such-cluster")


def test_a_boolean_is_not_a_number_but_still_a_flag() -> None:
    with pytest.raises(ValidationError, match="true is a boolean; expected a number"):
        Model.model_validate({**DENSE.model_dump(), "num_layers": True})
    with pytest.raises(ValidationError, match="false is a boolean"):
        Model.model_validate({**DENSE.model_dump(), "head_dim": False})  # int | None
    with pytest.raises(ValidationError, match="is a boolean"):
        Job.model_validate({"seq_len": 4096, "global_batch_size": True})
    flags = Model.model_validate({**DENSE.model_dump(), "gated_mlp": False,
                                  "tied_embeddings": True})
    assert flags.gated_mlp is False and flags.tied_embeddings is True
