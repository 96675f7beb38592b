"""The CLI error contract: bad input anywhere -> one `error:` line, exit code 2, no traceback.

Files go through placer's real loaders (load_model / load_cluster / load_job) behind the real
entry point ``placer.cli.main``; a small command added to the group for these tests calls them,
so every loader path is reached whichever commands exist. A few cases also run the installed
``placer`` executable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from placer.cli import cli, main
from placer.spec.presets import cluster_preset, load_cluster, load_job, load_model

PLACER = Path(sys.executable).parent / "placer"
HF = Path(__file__).parent / "data" / "hf"


@click.command("load-inputs")
@click.option("--model")
@click.option("--cluster")
@click.option("--job", type=click.Path(path_type=Path))
@click.option("--nodes", type=int)
def load_inputs(model: str | None, cluster: str | None, job: Path | None,
                nodes: int | None) -> None:
    """Load each given input the way placer's commands do."""
    if model:
        load_model(model)
    if cluster:
        loaded = load_cluster(cluster)
        if nodes is not None:
            loaded.with_nodes(nodes)
    if job:
        load_job(job)
    click.echo("ok")


@pytest.fixture()
def run(monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    monkeypatch.setitem(cli.commands, "load-inputs", load_inputs)

    def invoke(args: list[str]) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            main(args)
        captured = capsys.readouterr()
        code = info.value.code if isinstance(info.value.code, int) else 0
        return code, captured.out, captured.err

    return invoke


def _assert_user_error(result: tuple[int, str, str], *words: str) -> None:
    code, out, err = result
    assert code == 2, err
    assert out == ""
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err


def _cluster_yaml() -> str:
    return (Path(__file__).parents[1] / "placer" / "spec" / "presets" / "clusters" /
            "dgx-h100.yaml").read_text()


def _model_dict() -> dict[str, object]:
    return {"name": "tiny", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
            "ffn_hidden_size": 1024, "vocab_size": 1000}


def test_good_inputs_load(run: Callable[[list[str]], tuple[int, str, str]],
                          tmp_path: Path) -> None:
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(_model_dict()))
    cluster = tmp_path / "c.yaml"
    cluster.write_text(_cluster_yaml())
    job = tmp_path / "job.yaml"
    job.write_text("seq_len: 4096\nglobal_batch_size: 64\nconstraints: ['tp<=8']\n")
    assert run(["load-inputs", "--model", str(model), "--cluster", str(cluster), "--job",
                str(job)]) == (0, "ok\n", "")
    assert run(["load-inputs", "--model", str(HF / "llama-3-8b" / "config.json"),
                "--cluster", "dgx-a100", "--nodes", "4"])[0] == 0


@pytest.mark.parametrize(("option", "ref", "words"), [
    ("--cluster", "dgx-h1000", ["--cluster: 'dgx-h1000' is not valid", "dgx-h100"]),
    ("--model", "llama9-8b", ["--model: 'llama9-8b' is not valid", "llama3-8b"]),
])
def test_unknown_preset(run: Callable[[list[str]], tuple[int, str, str]], option: str, ref: str,
                        words: list[str]) -> None:
    _assert_user_error(run(["load-inputs", option, ref]), *words)


@pytest.mark.parametrize(("name", "text", "words"), [
    ("negative.yaml", _cluster_yaml().replace("count: 1", "count: -2"),
     ["pools.0.count", "-2", "greater than or equal to 1"]),
    ("misspelled.yaml", _cluster_yaml().replace("gpus_per_node:", "gpus_per_nodes:"),
     ["node_types.0.gpus_per_nodes: unknown field; did you mean 'gpus_per_node'?"]),
    ("misspelled_optional.yaml", _cluster_yaml().replace("nodes_per_leaf:", "nodes_per_leaves:"),
     ["network.nodes_per_leaves: unknown field; check its spelling against "
      "`placer schema cluster`"]),
    ("missing.yaml", _cluster_yaml().replace("    gpus_per_node: 8\n", ""),
     ["node_types.0.gpus_per_node: required field is missing; `placer init cluster` writes a "
      "commented example"]),
    ("bare.yaml", "name: x\n",  # every missing field at once, not one per attempt
     ["bare.yaml: required fields are missing: node_types, pools; `placer init cluster`"]),
    ("bad_gpu.yaml", _cluster_yaml().replace("gpu: H100-SXM-80GB", "gpu: H100-SXM-8GB"),
     ["node_types.0.gpu: 'H100-SXM-8GB' is not valid; did you mean H100-SXM-80GB"]),
    ("malformed.yaml", "name: x\nnode_types: [\n  {name: a,\n", ["invalid YAML"]),
    ("truncated.json", json.dumps(cluster_preset("dgx-h100").model_dump(mode="json"))[:300],
     ["truncated.json:1: invalid JSON"]),
    ("nan.json", '{"name": "x", "node_types": [], "pools": [], "latency": {"nvlink_s": NaN}}',
     ["NaN is not allowed"]),
    ("inf.yaml", _cluster_yaml().replace("oversubscription: 1.0", "oversubscription: .inf"),
     ["network: oversubscription", "inf is not allowed"]),
    ("list.yaml", "- dgx-h100\n- dgx-a100\n", ["expected a mapping of cluster fields"]),
    ("empty.yaml", "", ["expected a mapping of cluster fields"]),
])
def test_bad_cluster_file(run: Callable[[list[str]], tuple[int, str, str]], tmp_path: Path,
                          name: str, text: str, words: list[str]) -> None:
    path = tmp_path / name
    path.write_text(text)
    _assert_user_error(run(["load-inputs", "--cluster", str(path)]), str(path), *words)


@pytest.mark.parametrize(("name", "content", "words"), [
    ("misspelled.json", {k if k != "num_layers" else "num_layer": v
                         for k, v in _model_dict().items()},
     ["num_layer: unknown field; did you mean 'num_layers'?"]),
    ("negative.json", {**_model_dict(), "num_layers": -4}, ["num_layers: -4 is not valid"]),
    ("heads.json", {**_model_dict(), "num_kv_heads": 3}, ["must divide num_attention_heads"]),
    ("string.json", {**_model_dict(), "hidden_size": "big"}, ["hidden_size: 'big'"]),
    ("boolean.json", {**_model_dict(), "num_layers": True},
     ["num_layers: True is not valid; true is a boolean; expected a number"]),
    ("moe-boolean.json", {**_model_dict(), "moe": {"num_experts": 8, "top_k": False,
                                                   "expert_ffn_hidden_size": 64}},
     ["moe.top_k: False is not valid"]),
    ("list.json", [_model_dict()], ["expected a mapping of model fields"]),
])
def test_bad_model_file(run: Callable[[list[str]], tuple[int, str, str]], tmp_path: Path,
                        name: str, content: object, words: list[str]) -> None:
    path = tmp_path / name
    path.write_text(json.dumps(content))
    _assert_user_error(run(["load-inputs", "--model", str(path)]), *words)


def test_hf_config_missing_a_key(run: Callable[[list[str]], tuple[int, str, str]],
                                 tmp_path: Path) -> None:
    config = json.loads((HF / "mixtral-8x7b" / "config.json").read_text())
    del config["num_experts_per_tok"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    _assert_user_error(run(["load-inputs", "--model", str(path)]),
                       "Hugging Face key 'num_experts_per_tok' is missing")


@pytest.mark.parametrize(("text", "words"), [
    ("seq_len: 4096\nglobal_batch_size: 64\nconstraints: ['tp<<8']\n", ["constraints", "tp<<8"]),
    ("seq_len: 4096\nglobal_batch: 64\n", ["global_batch: unknown field; did you mean "
                                            "'global_batch_size'?"]),
    ("seq_len: 0\nglobal_batch_size: 64\n", ["seq_len: 0 is not valid"]),
])
def test_bad_job_file(run: Callable[[list[str]], tuple[int, str, str]], tmp_path: Path,
                      text: str, words: list[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    _assert_user_error(run(["load-inputs", "--job", str(path)]), *words)


def test_missing_and_unreadable_files(run: Callable[[list[str]], tuple[int, str, str]],
                                      tmp_path: Path) -> None:
    _assert_user_error(run(["load-inputs", "--cluster", str(tmp_path / "none.yaml")]),
                       "none.yaml: no such file")
    _assert_user_error(run(["load-inputs", "--model", str(tmp_path / "none" / "config.json")]),
                       "no such file")
    binary = tmp_path / "cluster.yaml"
    binary.write_bytes(b"\xff\xfe\xfa binary")
    _assert_user_error(run(["load-inputs", "--cluster", str(binary)]), "cannot read as UTF-8")


def test_with_nodes_on_a_mixed_cluster(run: Callable[[list[str]], tuple[int, str, str]],
                                       tmp_path: Path) -> None:
    a100 = cluster_preset("dgx-a100").node_types[0].model_dump(mode="json")
    h100 = cluster_preset("dgx-h100").node_types[0].model_dump(mode="json")
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps({"node_types": [a100, h100], "pools": [
        {"node_type": "dgx-a100", "count": 2}, {"node_type": "dgx-h100", "count": 2}]}))
    assert run(["load-inputs", "--cluster", str(path)])[0] == 0
    _assert_user_error(run(["load-inputs", "--cluster", str(path), "--nodes", "8"]),
                       "--nodes", "several node pools")


@pytest.mark.parametrize(("args", "words"), [
    (["schema", "modle"], ["'modle' is not one of 'bench', 'bench-config', 'check', 'cluster'"]),
    (["presets", "--yaml"], ["No such option '--yaml'"]),
    (["frobnicate"], ["No such command 'frobnicate'"]),
])
def test_usage_errors(run: Callable[[list[str]], tuple[int, str, str]], args: list[str],
                      words: list[str]) -> None:
    _assert_user_error(run(args), *words)


def test_the_installed_command(tmp_path: Path) -> None:
    """The console script itself: one line on stderr, exit 2, no traceback."""
    bad = tmp_path / "cluster.json"
    bad.write_text('{"name": "x", "pools": [{"node_type": "x", "count": NaN}]}')
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --tensor-model-parallel-size 8\n")
    for args, word in (([str(script), "--cluster", str(bad)], "NaN is not allowed"),
                       ([str(script), "--cluster", "nope-cluster"], "use a preset")):
        result = subprocess.run([str(PLACER), "check", *args], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        assert word in result.stderr and "Traceback" not in result.stderr
    result = subprocess.run([str(PLACER), "schema", "nope"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
