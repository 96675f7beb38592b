"""``placer check`` reads torchtitan's ``fsdp_reshard_after_forward`` as torchtitan resolves it.

torchtitan turns the policy into one ``reshard_after_forward`` for every block and the
embedding (pytorch/torchtitan@73a0e6979dd10b6b1904098eb3c8f62c18ab87ce, v0.2.2,
torchtitan/models/llama3/infra/parallelize.py apply_fsdp; torchtitan 0.3.0
torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy): "always" True, "never"
False, "default" ``not pp_enabled``; anything else stops it (``ValueError: Invalid
reshard_after_forward_policy``). The key sits under ``[parallelism]`` (``[training]`` before
torchtitan@785c34c). ``placer launch`` writes "never" for a plan's zero=1/2, so the file runs
FSDP with the parameters kept gathered from the forward through the backward.

The independent path for the memory figures is ``placer estimate`` given the layout torchtitan
runs (zero=3 with reshard off/on), the stack and the job explicitly, and a hand count of what
"never" keeps that "default" frees: the bf16 weights of the blocks not in flight.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_cli import cli
from helpers_launch import candidate, plan

from placer.check import read_config
from placer.check.parse_torchtitan_py import parse_torchtitan_py
from placer.spec import Job, Layout
from placer.spec.presets import load_cluster, model_preset

DATA = Path(__file__).resolve().parent / "data" / "check_corpus" / "torchtitan"
# pytorch/torchtitan@73a0e6979dd10b6b1904098eb3c8f62c18ab87ce (v0.2.2)
# torchtitan/models/llama3/train_configs/llama3_8b.toml: Llama 3 8B, seq_len 8192, local batch
# 1, FSDP over every GPU (data_parallel_shard_degree = -1), selective_ac_option = "op"; it
# leaves fsdp_reshard_after_forward out
LLAMA3_8B = DATA / "v0.2.2_llama3_8b.toml"
# same commit, torchtitan/models/deepseek_v3/train_configs/deepseek_v3_16b.toml: writes
# fsdp_reshard_after_forward = "default" explicitly
DEEPSEEK_16B = DATA / "v0.2.2_deepseek_v3_16b.toml"
# LambdaLabsML/torchtitan@035085233cc4afea88d5b47a8e6281dfa96601f3
# torchtitan/models/gpt_oss/config_registry.py (0.3 Python configs), excerpt: gpt_oss_20b and
# gpt_oss_20b_gb300_noreshard (config.parallelism.fsdp_reshard_after_forward = "never")
GPT_OSS = Path(__file__).resolve().parent / "fixtures" / "torchtitan_gpt_oss_noreshard_excerpt.py"
CHECK = ["--cluster", "dgx-a100-40gb", "--nodes", "1"]
LAYOUT = "tp=1,pp=1,dp=8,mbs=1,zero=3,recompute=op"  # llama3_8b.toml on one 8-GPU node
ANCHOR = "data_parallel_shard_degree = -1\n"
PP_ONE = "pipeline_parallel_degree = 1\n"
GIB = 2**30


def _variant(tmp_path: Path, name: str, policy: str, pp: int = 1) -> Path:
    """llama3_8b.toml with ``fsdp_reshard_after_forward = policy`` in its [parallelism] (and
    ``pipeline_parallel_degree = pp``)."""
    text = LLAMA3_8B.read_text()
    assert ANCHOR in text and PP_ONE in text and "fsdp_reshard_after_forward" not in text
    path = tmp_path / name / LLAMA3_8B.name
    path.parent.mkdir()
    path.write_text(text.replace(ANCHOR, f"{ANCHOR}fsdp_reshard_after_forward = {policy}\n")
                    .replace(PP_ONE, f"pipeline_parallel_degree = {pp}\n"))
    return path


def _check(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    code, out, err = cli(["check", str(path), *CHECK, *extra, "--format", "json"], capsys)
    assert code in (0, 1), err
    return json.loads(out)


def _peak_gib(report: dict, index: int = 0) -> float:
    found = [f for f in report["findings"] if f["rule_id"] == "memory-over-capacity"]
    assert len(found) > index, report["findings"]
    return float(found[index]["message"].split("predicted peak ")[1].split(" GiB")[0])


def _estimate_gib(layout: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> float:
    """``placer estimate`` of the config's job on torchtitan's stack: 8 sequences of 8192
    tokens, the caching allocator without expandable segments (the file's environment)."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"seq_len": 8192, "global_batch_size": 8, "stack":
                               "torchtitan@0.2", "runtime": {"expandable_segments": False}}))
    code, out, err = cli(["estimate", "--model", "llama3-8b", *CHECK, "--job", str(job),
                          "--layout", layout, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)["memory"]["total_bytes"] / GIB


def test_policies_map_as_torchtitan_resolves_them(tmp_path: Path) -> None:
    read = {policy: read_config(_variant(tmp_path, policy, f'"{policy}"')).settings
            for policy in ("default", "always", "never")}
    assert {p: s.reshard_after_forward for p, s in read.items()} == {
        "default": None, "always": True, "never": False}
    assert all(s.zero_stage == 3 for s in read.values())
    # the real file that writes "default": Layout's own default (on without pipelining)
    assert read_config(DEEPSEEK_16B).settings.reshard_after_forward is None
    # the releases before [parallelism] kept it under [training]
    text = LLAMA3_8B.read_text().replace("[training]\n", '[training]\nfsdp_reshard_after_'
                                         'forward = "never"\n', 1)
    older = tmp_path / "training" / LLAMA3_8B.name
    older.parent.mkdir()
    older.write_text(text)
    assert read_config(older).settings.reshard_after_forward is False
    # without FSDP (dp_shard 1: DDP over dp_replicate) torchtitan never reads the policy
    ddp = _variant(tmp_path, "ddp", '"never"')
    ddp.write_text(ddp.read_text().replace(ANCHOR, "data_parallel_shard_degree = 1\n")
                   .replace("data_parallel_replicate_degree = 1\n",
                            "data_parallel_replicate_degree = 8\n"))
    settings = read_config(ddp).settings
    assert settings.zero_stage == 0 and settings.reshard_after_forward is None


def test_never_is_priced_as_kept_gathered(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """"never" at pp=1 keeps every block's bf16 weights from the forward through the backward:
    the peak is placer estimate's of zero=3 with reshard off (before: priced as "default",
    53.5 GiB on 40 GB A100s, a pass of the memory the file asks for)."""
    default = _check(_variant(tmp_path, "default", '"default"'), capsys)
    never = _check(_variant(tmp_path, "never", '"never"'), capsys)
    assert _peak_gib(default) == round(_estimate_gib(LAYOUT, capsys, tmp_path), 1)
    assert _peak_gib(never) == round(_estimate_gib(f"{LAYOUT},reshard=off", capsys, tmp_path),
                                     1)
    assert any("'never': FSDP parameters kept gathered" in n
               for n in never["configs"][0]["notes"])
    # hand count: "default" holds a block or the output unit gathered at a time, "never" all
    # 32 blocks; at least 30 blocks' bf16 weights more (218.1M parameters each: attention
    # 4096 x (4096 + 2 x 1024 + 4096), SwiGLU 3 x 4096 x 14336, two norms)
    block = 4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    assert _peak_gib(never) - _peak_gib(default) >= 30 * block * 2 / GIB  # 12.2 GiB


def test_always_under_pipelining_reshards(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """At pp=2 "default" is "never" (torchtitan: not pp_enabled); "always" reshards per
    micro-batch, priced as placer estimate's reshard=on."""
    layouts = {}
    for policy in ("default", "never", "always"):
        path = _variant(tmp_path, policy, f'"{policy}"', pp=2)
        settings = read_config(path).settings
        assert settings.pp == 2, policy
        resharded = Layout(pp=2, dp=4, zero_stage=3, reshard_after_forward=settings
                           .reshard_after_forward).reshards_after_forward
        assert resharded is (policy == "always"), policy
        layouts[policy] = _check(path, capsys)["configs"][0]["layout"]
    assert layouts["always"] == layouts["default"] + ",reshard=on"


def test_unknown_policy_is_what_torchtitan_refuses(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = _variant(tmp_path, "bad", '"sometimes"')
    report = _check(path, capsys)
    found = [f for f in report["findings"] if f["rule_id"] == "framework-refuses"]
    assert len(found) == 1, report["findings"]
    assert "parallelism.fsdp_reshard_after_forward = 'sometimes'" in found[0]["message"]
    assert found[0]["line"] == next(n for n, line in enumerate(path.read_text().splitlines(), 1)
                                    if line.startswith("fsdp_reshard_after_forward"))
    assert read_config(path).settings.reshard_after_forward is None  # checked as "default"
    # a TOML boolean is no policy either (torchtitan's match has no case for it)
    assert read_config(_variant(tmp_path, "bool", "false")).settings \
        .reshard_after_forward is None


def test_python_config_sets_never_by_assignment() -> None:
    configs = {p.label: p for p in parse_torchtitan_py(GPT_OSS, GPT_OSS.read_text())}
    assert configs["gpt_oss_20b"].settings.reshard_after_forward is None
    noreshard = configs["gpt_oss_20b_gb300_noreshard"]
    assert noreshard.settings.reshard_after_forward is False
    assert noreshard.settings.zero_stage == 3 and noreshard.settings.recompute == "full"
    line = GPT_OSS.read_text().splitlines()[noreshard.lines["reshard_after_forward"] - 1]
    assert line.strip() == 'config.parallelism.fsdp_reshard_after_forward = "never"'


@pytest.mark.parametrize("zero", [1, 2])
def test_launch_then_check_round_trip(zero: int, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A zero<3 plan launched (torchtitan has no ZeRO-1/2: FSDP with "never"), then checked:
    both torchtitan files are priced as the layout torchtitan runs, zero=3 with reshard off,
    equal to placer estimate of it on the same stack (before: reshard on, 12+ GiB less)."""
    model, cluster = model_preset("llama3-8b"), load_cluster("dgx-a100-40gb")
    job = Job(name="reshard", seq_len=8192, global_batch_size=8)
    layout = Layout(dp=8, zero_stage=zero, recompute="op", micro_batch_size=1)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan(model, cluster, [candidate(model, cluster, job, layout)],
                              job=job).model_dump_json())
    out = tmp_path / "launch"
    code, _, err = cli(["launch", str(plan_path), "--out", str(out)], capsys)
    assert code == 0, err
    assert 'fsdp_reshard_after_forward = "never"' in (out / "torchtitan.toml").read_text()
    report = _check(out / "torchtitan.toml", capsys, "--model", "llama3-8b")
    py = _check(out / "torchtitan_config.py", capsys)
    expected = round(_estimate_gib(f"{LAYOUT},reshard=off", capsys, tmp_path), 1)
    assert _peak_gib(report) == expected
    assert _peak_gib(py) == expected
    assert expected - round(_estimate_gib(LAYOUT, capsys, tmp_path), 1) > 12


def test_layout_file_keeps_reshard(tmp_path: Path) -> None:
    """A placer layout file's ``reshard=off`` reaches the check (before: dropped, priced on):
    its peak is the cost model's for that layout (54.9 -> 70.1 GiB here)."""
    from placer.check import CheckOptions, check_paths
    from placer.cost import memory_estimate

    text = ("layout: tp=1,pp=1,dp=8,mbs=1,zero=3,recompute=op,reshard=off\nmodel: llama3-8b\n"
            "cluster: dgx-a100-40gb\nseq_len: 8192\nglobal_batch_size: 8\n")
    path = tmp_path / "layout.yaml"
    path.write_text(text)
    assert read_config(path).settings.reshard_after_forward is False
    report = check_paths([path], CheckOptions())
    [found] = [f for f in report.findings if f.rule_id == "memory-over-capacity"]
    layout = Layout.parse("tp=1,pp=1,dp=8,mbs=1,zero=3,recompute=op,reshard=off")
    job = Job(seq_len=8192, global_batch_size=8, runtime={"expandable_segments": False})
    memory = memory_estimate(model_preset("llama3-8b"), load_cluster("dgx-a100-40gb"), job,
                             layout)
    assert f"predicted peak {memory.total_bytes / GIB:.1f} GiB" in found.message
