"""Files placer writes and reads: all or nothing out, one clear line for anything malformed in.

Writing: an interrupted write (a move into place that fails at any step, or a process killed
part-way) leaves no partial file and the previous content intact; existing files are replaced
only with --force. Reading: truncated YAML/JSON, wrong types, huge numbers, NaN, negative sizes,
deep nesting and alias bombs in every kind of input file give one ``error:`` line and exit 2.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers_cli import assert_one_line_error, cli
from helpers_launch import plan_2x2_tp_intra, plan_2x4_moe_remapped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.cli.recommend_command import write_outputs
from placer.errors import PlacerError
from placer.launch import write_launch_files
from placer.report.plan import Recommendation, plan_json
from placer.spec.presets import cluster_preset, load_job, model_preset

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
LAUNCH_FILES = 12


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden staging folders included) with its bytes."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


# ----- interrupted writes ---------------------------------------------------------------------


class Interrupted(OSError):
    pass


@contextmanager
def fail_at_move(step: int) -> Iterator[list[str]]:
    """Make the ``step``-th file-system move (rename, replace, copy) fail once, like a full or
    vanished disk; the moves after it (a rollback) succeed. Yields the moves seen."""
    seen: list[str] = []
    broken: set[str] = set()  # a destination that failed stays unwritable (no copy fallback)
    real = {"replace": os.replace, "rename": os.rename, "copyfile": shutil.copyfile}

    def wrap(name: str) -> Callable[..., Any]:
        def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(f"{name} {Path(src).name} -> {Path(dst).name}")
            if len(seen) == step or (name == "copyfile" and str(dst) in broken):
                broken.add(str(dst))
                raise Interrupted(28, "No space left on device", str(dst))
            return real[name](src, dst, *args, **kwargs)
        return move

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "replace", wrap("replace"))
        mp.setattr(os, "rename", wrap("rename"))
        mp.setattr(shutil, "copyfile", wrap("copyfile"))
        yield seen


def _emit(rec: Recommendation, folder: Path, **options: Any) -> list[Path]:
    return write_outputs(rec, folder, None, **options)


WRITERS: dict[str, Callable[..., list[Path]]] = {
    "placer launch": lambda folder, **kw: write_launch_files(plan_2x2_tp_intra(), 0, folder, **kw),
    "recommend-layout --emit": lambda folder, **kw: _emit(Recommendation(plan_2x4_moe_remapped()),
                                                          folder, **kw),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_interrupted_write_into_a_new_folder_leaves_nothing(writer: str) -> None:
    write = WRITERS[writer]
    with tempfile.TemporaryDirectory() as tmp:
        with fail_at_move(10**6) as seen:
            write(Path(tmp) / "clean")
        moves = len(seen)
    assert moves >= 1

    @SETTINGS
    @given(st.integers(1, moves))
    def check(step: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            parent = Path(tmp)
            with fail_at_move(step), pytest.raises(PlacerError) as info:
                write(parent / "out")
            assert "\n" not in str(info.value)
            assert _snapshot(parent) == {}, "a partial output or staging file was left"

    check()


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_interrupted_forced_rewrite_keeps_the_previous_files(writer: str) -> None:
    """--force over an earlier output: a failure at any step restores every earlier file."""
    write = WRITERS[writer]

    def prepare(parent: Path) -> tuple[Path, dict[str, bytes]]:
        out = parent / "out"
        write(out, script="old_train.py")
        (out / "notes.txt").write_text("the user's own file\n")
        return out, _snapshot(parent)

    with tempfile.TemporaryDirectory() as tmp:
        out, _ = prepare(Path(tmp))
        with fail_at_move(10**6) as seen:
            write(out, script="new_train.py", debug=True, force=True)
        moves = len(seen)
        assert b"new_train.py" in (out / "launch.sh").read_bytes()

    @SETTINGS
    @given(st.integers(1, moves))
    def check(step: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            parent = Path(tmp)
            out, before = prepare(parent)
            with fail_at_move(step), pytest.raises(PlacerError) as info:
                write(out, script="new_train.py", debug=True, force=True)
            assert "\n" not in str(info.value)
            assert _snapshot(parent) == before, "the earlier output was not kept intact"

    check()


_KILL_AT = """
import os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from helpers_launch import plan_2x2_tp_intra
from placer.launch import write_launch_files
step, moves = int(sys.argv[1]), [0]
real_replace, real_rename = os.replace, os.rename
def dying(real):
    def move(src, dst, *a, **k):
        moves[0] += 1
        if moves[0] == step:
            os._exit(9)  # killed mid-write: no cleanup, no rollback
        return real(src, dst, *a, **k)
    return move
os.replace, os.rename = dying(real_replace), dying(real_rename)
write_launch_files(plan_2x2_tp_intra(), 0, Path(sys.argv[2]), script="new_train.py", force=True)
"""


def test_killed_write_leaves_only_whole_files(tmp_path: Path) -> None:
    """A process killed between two moves cannot roll back, but no file is ever half-written:
    each one holds either its earlier or its new content."""
    out = tmp_path / "out"
    write_launch_files(plan_2x2_tp_intra(), 0, out, script="old_train.py")
    old = _snapshot(out)
    new_dir = tmp_path / "new"
    write_launch_files(plan_2x2_tp_intra(), 0, new_dir, script="new_train.py")
    new = _snapshot(new_dir)
    program = tmp_path / "kill.py"
    program.write_text(_KILL_AT.format(tests=str(Path(__file__).parent)))
    for step in range(1, LAUNCH_FILES + 3):
        shutil.rmtree(out)
        write_launch_files(plan_2x2_tp_intra(), 0, out, script="old_train.py")
        done = subprocess.run([sys.executable, str(program), str(step), str(out)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode in (0, 9), done.stderr
        now = _snapshot(out)
        assert sorted(now) == sorted(old)
        for name, data in now.items():
            assert data in (old[name], new[name]), f"{name} is partial after a kill at {step}"


def test_existing_files_need_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_json(plan_2x2_tp_intra()))
    out = tmp_path / "out"
    assert cli(["launch", str(plan_path), "--out", str(out)], capsys)[0] == 0
    before = _snapshot(out)
    code, _, err = cli(["launch", str(plan_path), "--out", str(out), "--script", "x.py"], capsys)
    assert_one_line_error(code, err)
    assert "--force" in err and _snapshot(out) == before
    code, _, _ = cli(["launch", str(plan_path), "--out", str(out), "--script", "x.py",
                       "--force"], capsys)
    assert code == 0 and b"x.py" in (out / "launch.sh").read_bytes()
    assert sorted(_snapshot(out)) == sorted(before)


def test_recommend_emit_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "emit"
    args = ["recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
            "--seq-len", "4096", "--global-batch", "64", "--top", "1", "--json", "--emit",
            str(out)]
    code, _, err = cli(args, capsys)
    assert code == 0, err
    before = _snapshot(out)
    assert "plan.json" in before and len(before) == LAUNCH_FILES + 1
    code, stdout, err = cli([*args, "--script", "other.py"], capsys)
    assert_one_line_error(code, err)
    assert stdout == "" and _snapshot(out) == before
    code, _, err = cli([*args, "--script", "other.py", "--force"], capsys)
    assert code == 0, err
    assert b"other.py" in (out / "launch.sh").read_bytes()


# ----- malformed input files ------------------------------------------------------------------


def _layout_file(folder: Path) -> Path:
    path = folder / "layout.yaml"
    path.write_text("layout: tp=8,pp=1\n")
    return path


def _model_doc() -> dict[str, Any]:
    return model_preset("mixtral-8x7b").model_dump(mode="json", exclude_none=True)


def _cluster_doc() -> dict[str, Any]:
    return cluster_preset("dgx-h100").model_dump(mode="json", exclude_none=True)


def _plan_doc() -> dict[str, Any]:
    return json.loads(plan_json(plan_2x4_moe_remapped()))


def _job_doc() -> dict[str, Any]:
    return {"name": "j", "seq_len": 4096, "global_batch_size": 64,
            "constraints": ["tp<=8", "pp in 1,2"], "optimizer": {"name": "adam"}}


def _profile_doc() -> dict[str, Any]:
    return {"format": "placer-link-profile/1", "cluster": "dgx-h100",
            "intra_node": {"latency_s": 5e-6, "bandwidth_bytes_per_s": 3.6e11},
            "inter_node": {"latency_s": 1.2e-5, "bandwidth_bytes_per_s": 4.6e10},
            "gemm": {"max_efficiency": 0.6}}


RECOMMEND = ["recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
             "--seq-len", "4096", "--global-batch", "64", "--top", "1", "--json"]


def _load(kind: str, path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Load ``path`` as ``kind`` through the command that reads it; (exit code, stderr)."""
    folder = path.parent
    if kind == "job":  # no command takes a job file: the loader's own contract
        try:
            load_job(path)
        except PlacerError as exc:
            return 2, f"error: {exc}\n"
        return 0, ""
    args = {
        "model": ["check", "--model", str(path), "--cluster", "dgx-h100",
                  str(_layout_file(folder))],
        "cluster": ["check", "--cluster", str(path), str(_layout_file(folder))],
        "plan": ["launch", str(path), "--out", str(folder / "out")],
        "plan-check": ["check", str(path)],
        "profile": [*RECOMMEND, "--profile", str(path)],
    }[kind]
    code, _, err = cli(args, capsys)
    return code, err


DOCS: dict[str, Callable[[], dict[str, Any]]] = {
    "model": _model_doc, "cluster": _cluster_doc, "plan": _plan_doc, "plan-check": _plan_doc,
    "job": _job_doc, "profile": _profile_doc,
}


def _dump(doc: Any, suffix: str) -> str:
    if suffix == ".json":
        return json.dumps(doc, indent=1)
    return yaml.safe_dump(doc, sort_keys=False)


def _suffixes(kind: str) -> tuple[str, ...]:
    return (".json",) if kind.startswith("plan") else (".yaml", ".json")


@pytest.mark.parametrize("kind", sorted(DOCS))
def test_valid_documents_load(kind: str, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """The base documents the malformed ones are cut from are themselves fine."""
    for suffix in _suffixes(kind):
        path = tmp_path / f"input{suffix}"
        path.write_text(_dump(DOCS[kind](), suffix))
        code, err = _load(kind, path, capsys)
        assert code in (0, 1), err  # placer check: 1 = findings in a readable config


@pytest.mark.parametrize("kind", sorted(DOCS))
def test_truncated_files_give_one_line_and_exit_2(kind: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A cut JSON file never parses. A cut YAML file may still be a valid document (``32000``
    cut to ``320``): then it loads; most cuts must be refused."""
    outcomes: list[int] = []

    @SETTINGS
    @given(st.sampled_from(_suffixes(kind)), st.floats(0.0, 0.98))
    def check(suffix: str, fraction: float) -> None:
        text = _dump(DOCS[kind](), suffix)
        cut = text[:int(len(text) * fraction)]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"input{suffix}"
            path.write_text(cut)
            code, err = _load(kind, path, capsys)
            if suffix == ".yaml" and code in (0, 1):
                assert "Traceback" not in err
            else:
                assert_one_line_error(code, err)
            outcomes.append(code)

    check()
    assert outcomes.count(2) >= 0.8 * len(outcomes), outcomes


HOSTILE_VALUES = (None, True, "", "x" * 10_000, [], {}, [1, 2], {"a": 1}, -1, 0, -0.5, 1.5,
                  10**30, 2**63, 10**400, 1e308, -1e308, math.nan, math.inf, -math.inf,
                  "1e999", "NaN", "-1")


@st.composite
def mutations(draw: st.DrawFn, doc: Any) -> tuple[list[Any], Any]:
    """A path into ``doc`` (keys and indices) and the value to put there."""
    path: list[Any] = []
    node = doc
    while isinstance(node, dict | list) and node and draw(st.integers(0, 4)) > 0:
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict)
                                   else range(len(node))))
        path.append(key)
        node = node[key]
    return path, draw(st.sampled_from(HOSTILE_VALUES))


def _set(doc: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize("kind", sorted(DOCS))
def test_wrong_types_and_bad_numbers_give_one_line_and_exit_2(
        kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A value swapped for another type, a huge, negative or non-finite number: exit 2 with one
    line, unless the swap happens to leave a valid file (a bool for a bool, null for an
    optional field), which must then load. Most swaps must be refused."""
    outcomes: list[int] = []

    @SETTINGS
    @given(st.sampled_from(_suffixes(kind)), mutations(DOCS[kind]()))
    def check(suffix: str, mutation: tuple[list[Any], Any]) -> None:
        path_in_doc, value = mutation
        doc = _set(DOCS[kind](), path_in_doc, value)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"input{suffix}"
            path.write_text(_dump(doc, suffix))
            code, err = _load(kind, path, capsys)
            if code in (0, 1):
                assert "Traceback" not in err
            else:
                assert_one_line_error(code, err)
            outcomes.append(code)

    check()
    assert outcomes.count(2) >= len(outcomes) // 2, outcomes


def _alias_bomb() -> str:
    """Ten levels of ten aliases each: 10**10 values once expanded ("billion laughs")."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


MALFORMED: dict[str, tuple[str, str | bytes]] = {
    "empty": (".json", ""),
    "whitespace": (".yaml", " \n\t\n"),
    "a scalar": (".yaml", "42\n"),
    "a list": (".json", "[1, 2, 3]\n"),
    "not UTF-8": (".json", b"\xff\xfe\x00{"),
    "binary": (".yaml", bytes(range(256))),
    "NaN in JSON": (".json", '{"num_layers": NaN, "name": "x"}'),
    "NaN in YAML": (".yaml", "num_layers: .nan\nname: x\n"),
    "Infinity in JSON": (".json", '{"x": -Infinity}'),
    "Infinity in YAML": (".yaml", "x: -.inf\n"),
    "5000-digit number": (".json", '{"x": ' + "9" * 5000 + "}"),
    "deeply nested JSON": (".json", "[" * 100_000 + "]" * 100_000),
    "deeply nested YAML": (".yaml", "a: " + "[" * 100_000 + "]" * 100_000),
    "YAML alias bomb": (".yaml", _alias_bomb()),
    "YAML python tag": (".yaml", "!!python/object/apply:os.system ['true']\n"),
    "tab indentation": (".yaml", "name: x\n\tnum_layers: 2\n"),
    "unclosed braces": (".json", "{{}}"),
}


@pytest.mark.parametrize("kind", sorted(DOCS))
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_give_one_line_and_exit_2(kind: str, case: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    suffix, content = MALFORMED[case]
    path = tmp_path / f"input{suffix}"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    code, err = _load(kind, path, capsys)
    assert_one_line_error(code, err)


def test_oversized_file_is_refused_without_reading_it(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as handle:  # sparse: 65 MiB that take no disk space
        handle.truncate(65 * 2**20)
    for kind in ("model", "cluster", "job"):
        code, err = _load(kind, path, capsys)
        assert_one_line_error(code, err)
        assert "larger than" in err


def test_negative_sizes_name_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _cluster_doc()
    doc["node_types"][0]["gpu"]["memory_bytes"] = -80_000_000_000
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, err = _load("cluster", path, capsys)
    assert_one_line_error(code, err)
    assert "node_types.0.gpu.memory_bytes" in err and "-80000000000" in err


# ----- configs for placer check, and numbers in flags -----------------------------------------

# Text a number field may hold: unicode digits str.isdigit() accepts but int() does not, more
# digits than int() converts, signs, floats, hex, shell variables, empties.
NUMBER_JUNK = ("\u00b2", "\u0663", "\uff18", "9" * 5000, "9" * 30, "-1", "0", "1e3", "0x10",
               " 8 ", "NaN", "inf", "", "$TP", "${TP:-8}", "8;x", "1_000", "+8", "8.0", "8", "2")
MEGATRON_FLAGS = ("tensor-model-parallel-size", "pipeline-model-parallel-size",
                  "context-parallel-size", "num-layers", "micro-batch-size", "global-batch-size",
                  "seq-length", "num-virtual-stages-per-pipeline-rank", "num-experts",
                  "expert-model-parallel-size", "hidden-size", "num-attention-heads")
TOML_KEYS = ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
             "data_parallel_shard_degree", "data_parallel_replicate_degree",
             "expert_parallel_degree")
TOML_VALUES = ("8", "0", "-4", "9" * 5000, "9" * 30, "1.5", "nan", "inf", '"8"', "[8]",
               "{a = 1}", "true", "[" * 5000 + "]" * 5000, "2024-01-01")


def _check_cli(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> None:
    """``placer check``: a verdict (0 or 1), or exit 2 with one error line per unreadable file."""
    code, stdout, err = cli(["check", "--cluster", "dgx-h100", *extra, str(path)], capsys)
    assert "Traceback" not in err + stdout
    if code == 2:
        assert_one_line_error(code, err)
    else:
        assert code in (0, 1) and err == "", err


def test_megatron_scripts_with_junk_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    @SETTINGS
    @given(st.dictionaries(st.sampled_from(MEGATRON_FLAGS), st.sampled_from(NUMBER_JUNK),
                           min_size=1), st.sampled_from(NUMBER_JUNK))
    def check(flags: dict[str, str], nproc: str) -> None:
        args = " ".join(f"--{flag} {shlex.quote(value)}" for flag, value in sorted(flags.items()))
        text = (f"GPUS_PER_NODE={shlex.quote(nproc)}\n"
                f"torchrun --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py {args}\n")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "train.sh"
            path.write_text(text)
            _check_cli(path, capsys)

    check()


def test_torchtitan_tomls_with_junk_values(capsys: pytest.CaptureFixture[str]) -> None:
    @SETTINGS
    @given(st.dictionaries(st.sampled_from(TOML_KEYS), st.sampled_from(TOML_VALUES),
                           min_size=1))
    def check(values: dict[str, str]) -> None:
        body = "".join(f"{key} = {value}\n" for key, value in sorted(values.items()))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "train.toml"
            path.write_text(f"[parallelism]\n{body}[training]\nseq_len = 8192\n")
            _check_cli(path, capsys)

    check()


def test_layout_files_and_flags_with_junk_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    @SETTINGS
    @given(st.sampled_from(("tp", "pp", "dp", "mbs", "zero", "vpp")), st.sampled_from(NUMBER_JUNK))
    def check(key: str, value: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "layout.yaml"
            path.write_text(yaml.safe_dump({"layout": f"{key}={value}", "model": "llama3-8b"}))
            _check_cli(path, capsys)
            _check_cli(_layout_file(Path(tmp)), capsys, "--candidate", value)
            code, _, err = cli([*RECOMMEND, "--constraint", f"{key}<={value}"], capsys)
            if code != 0:
                assert_one_line_error(code, err)
                assert "int()" not in err  # the user's words, not Python's
            code, _, err = cli(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                 "--seq-len", "4096", "--global-batch", "64",
                                 "--layout", f"{key}={value}"], capsys)
            if code != 0:
                assert_one_line_error(code, err)

    check()


def test_imported_topologies_with_junk_numbers(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``placer topology import``: a tool dump with odd numbers in it is read or refused."""
    sample = Path(__file__).parent / "data" / "topo"
    cases = []
    xml = (sample / "h100_ibm_8gpu.xml").read_text()
    for junk in ("\u00b2", "9" * 5000, "-1", ""):
        for attribute in ("dev", "sm", "numaid", "speed", "count", "link_width"):
            cases.append(("nccl.xml", xml.replace(f'{attribute}="', f'{attribute}="{junk}', 1)))
    smi = (sample / "pcie_8gpu.txt").read_text()
    for junk in ("\u00b2", "9" * 5000):
        cases.append(("smi.txt", smi.replace("0-", f"{junk}-", 1).replace("\t0\t", f"\t{junk}\t")))
    for index, (name, text) in enumerate(cases):
        path = tmp_path / f"{index}-{name}"
        path.write_text(text)
        code, _, err = cli(["topology", "import", str(path), "--gpu", "H100-SXM-80GB",
                             "--out", str(tmp_path / f"{index}.yaml")], capsys)
        assert "Traceback" not in err
        if code != 0:
            assert_one_line_error(code, err)


def test_topology_import_out_needs_force(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sample = Path(__file__).parent / "data" / "topo" / "pcie_8gpu.txt"
    out = tmp_path / "node.yaml"
    args = ["topology", "import", str(sample), "--gpu", "L40S", "--out", str(out)]
    assert cli(args, capsys)[0] == 0
    out.write_text("# edited by hand\n")
    code, _, err = cli(args, capsys)
    assert_one_line_error(code, err)
    assert "--force" in err and out.read_text() == "# edited by hand\n"
    with fail_at_move(1):
        code, _, err = cli([*args, "--force"], capsys)
    assert_one_line_error(code, err)
    assert _snapshot(tmp_path) == {"node.yaml": b"# edited by hand\n"}
    assert cli([*args, "--force"], capsys)[0] == 0
    assert out.read_text().startswith("#") and "gpus_per_node: 8" in out.read_text()
