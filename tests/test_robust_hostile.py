"""Hostile strings in every free-text field are rejected, or quoted so no injected command runs.

Each generated value carries a payload that would create a marker file if a shell ever parsed it
as code: ``$(touch M)``, backticks, ``; touch M``, broken-out quotes, newlines, redirections.
Fields with a pattern on the spec (job, host, interface, model, NIC, node-type, cluster and GPU
names) must be refused by ``placer launch`` / ``recommend-layout`` with one ``error:`` line and
exit code 2, writing nothing. Free-form values (the training script path, the output folder,
and what the launch environment hands the scripts at run time) must reach the programs as
exactly one, unchanged argument: the generated launch.sh, job.sbatch, env.sh and
megatron_args.sh run for real under bash in a sandbox whose python, torchrun, srun and scontrol
are stand-ins that record their argv, and the marker must never appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers_cli import assert_one_line_error, cli
from helpers_launch import plan_2x2_tp_intra, plan_2x4_moe_remapped
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from placer.report.plan import plan_json

MARK = "@MARK@"  # replaced by the marker's absolute path inside each example
PAYLOADS = (
    f"$(touch {MARK})", f"`touch {MARK}`", f"; touch {MARK}", f"' ; touch {MARK} ; '",
    f'"; touch {MARK}; "', f"\ntouch {MARK}\n", f"&& touch {MARK}", f"| touch {MARK}",
    f"$(touch${{IFS}}{MARK})", f"\\$(touch {MARK})", f"'$(touch {MARK})'", f'"$(touch {MARK})"',
    f"\r\ntouch {MARK}", f"${{x:-$(touch {MARK})}}", f"<(touch {MARK})", f">{MARK}",
    f"$'\\n'touch {MARK}", f"\u2028touch {MARK}", f"*;touch {MARK}#",
    f"-o ProxyCommand=touch {MARK}",
)
# Unicode, quotes, glob and shell metacharacters around the payload; no NUL (argv and file
# names cannot hold one; the pattern tests use JSON, which can).
_AROUND = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")
                  | st.sampled_from("'\"`$\\;&|<>(){}[]*?~! \t\n\u00e9\u4e2d\U0001f680"),
                  max_size=4)
HOSTILE = st.builds(lambda pre, payload, post: pre + payload + post, _AROUND,
                    st.sampled_from(PAYLOADS), _AROUND)

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

FAKE_PROGRAM = """#!/bin/bash
# Stand-in: record the program name and argv, NUL-separated, one file per call.
call=$(mktemp "$SANDBOX_LOG/call.XXXXXXXX")
printf '%s\\0' "$(basename "$0")" "$@" > "$call"
"""
FAKE_SCONTROL = FAKE_PROGRAM + """
[[ "$1 $2" == "show hostnames" ]] && printf '%s\\n' "$SANDBOX_HOSTS" host-b
"""
FAKE_SRUN = FAKE_PROGRAM + """while [[ "$1" == --* ]]; do shift; done
for id in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do SLURM_NODEID=$id "$@" || exit $?; done
"""


class Sandbox:
    """A temporary folder with stand-in programs on PATH and the marker the payloads create.

    ``relative`` markers (a bare file name, created in the working directory the scripts run
    in) serve where the hostile value becomes a file name, which cannot hold a '/'.
    """

    def __init__(self, root: Path, relative: bool = False) -> None:
        self.root = root
        self.marker = root / "INJECTED"
        self.marker_text = "INJECTED" if relative else str(self.marker)
        self.log = root / "calls"
        self.log.mkdir()
        self.bin = root / "bin"
        self.bin.mkdir()
        for name in ("python", "python3", "torchrun"):
            self._program(name, FAKE_PROGRAM)
        self._program("srun", FAKE_SRUN)
        self._program("scontrol", FAKE_SCONTROL)

    def _program(self, name: str, text: str) -> None:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)

    def value(self, template: str) -> str:
        return template.replace(MARK, self.marker_text)

    def run(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
        """Run in the sandbox folder (where a relative marker would appear)."""
        base = {"PATH": f"{self.bin}:/usr/bin:/bin", "SANDBOX_LOG": str(self.log),
                "SANDBOX_HOSTS": "host-a", "HOME": str(self.root)}
        return subprocess.run(argv, env={**base, **env}, cwd=self.root, capture_output=True,
                              timeout=60, check=False)

    def calls(self, *programs: str) -> list[list[str]]:
        """Recorded argv lists of the given stand-ins (all when none given), name first."""
        out = []
        for path in sorted(self.log.iterdir()):
            argv = path.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
            if not programs or argv[0] in programs:
                out.append(argv)
        return out

    def assert_clean(self) -> None:
        assert not self.marker.exists(), "an injected command ran"


def _sandbox() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="placer-hostile-")


# ----- fields with a pattern: refused ---------------------------------------------------------


def _set_job_name(plan: dict[str, Any], value: str) -> None:
    plan["job"]["name"] = value


def _set_hostname(plan: dict[str, Any], value: str) -> None:
    plan["cluster"]["pools"][0]["hostnames"] = ["node-a", value]


def _set_ifname(plan: dict[str, Any], value: str) -> None:
    plan["cluster"]["socket_ifname"] = value


def _set_model_name(plan: dict[str, Any], value: str) -> None:
    plan["model"]["name"] = value


def _set_nic_name(plan: dict[str, Any], value: str) -> None:
    plan["cluster"]["node_types"][0]["nics"][0]["name"] = value


def _set_nic_netdev(plan: dict[str, Any], value: str) -> None:
    plan["cluster"]["node_types"][0]["nics"][0]["netdev"] = value


def _set_node_type(plan: dict[str, Any], value: str) -> None:
    plan["cluster"]["node_types"][0]["name"] = value
    plan["cluster"]["pools"][0]["node_type"] = value


def _set_cluster_name(plan: dict[str, Any], value: str) -> None:
    plan["cluster"]["name"] = value


def _set_gpu_name(plan: dict[str, Any], value: str) -> None:
    plan["cluster"]["node_types"][0]["gpu"]["name"] = value


PATTERN_FIELDS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "job.name": _set_job_name, "hostname": _set_hostname, "socket_ifname": _set_ifname,
    "model.name": _set_model_name, "nic.name": _set_nic_name, "nic.netdev": _set_nic_netdev,
    "node_type.name": _set_node_type, "cluster.name": _set_cluster_name,
    "gpu.name": _set_gpu_name,
}
_BASE_PLAN = json.loads(plan_json(plan_2x2_tp_intra()))


@pytest.mark.parametrize("field", sorted(PATTERN_FIELDS))
def test_pattern_fields_refuse_hostile_values(field: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    @SETTINGS
    @given(HOSTILE)
    def check(template: str) -> None:
        with _sandbox() as tmp:
            box = Sandbox(Path(tmp))
            data = json.loads(json.dumps(_BASE_PLAN))
            PATTERN_FIELDS[field](data, box.value(template))
            plan_path = box.root / "plan.json"
            plan_path.write_text(json.dumps(data))
            out = box.root / "out"
            code, stdout, err = cli(["launch", str(plan_path), "--out", str(out)], capsys)
            assert_one_line_error(code, err)
            assert not out.exists() and stdout == ""
            assert not [p for p in box.root.iterdir() if p.name.startswith(".out.")]
            box.assert_clean()

    check()


def test_hostile_cluster_and_model_files_are_refused_before_solving(
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster = json.loads(json.dumps(_BASE_PLAN["cluster"]))
    model = json.loads(json.dumps(_BASE_PLAN["model"]))

    @SETTINGS
    @given(HOSTILE, st.sampled_from(("hostname", "socket_ifname", "nic.name", "model.name")))
    def check(template: str, field: str) -> None:
        with _sandbox() as tmp:
            box = Sandbox(Path(tmp))
            data = {"cluster": json.loads(json.dumps(cluster)),
                    "model": json.loads(json.dumps(model))}
            PATTERN_FIELDS[field](data, box.value(template))
            (box.root / "c.json").write_text(json.dumps(data["cluster"]))
            (box.root / "m.json").write_text(json.dumps(data["model"]))
            code, _, err = cli(["recommend-layout", "--model", str(box.root / "m.json"),
                                 "--cluster", str(box.root / "c.json"), "--emit",
                                 str(box.root / "emit")], capsys)
            assert_one_line_error(code, err)
            assert not (box.root / "emit").exists()
            box.assert_clean()

    check()


def test_hostile_model_file_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A model file without a name is named after the file: the file name is input too."""
    @SETTINGS
    @given(HOSTILE.filter(lambda s: "/" not in s and s not in (".", "..")))
    def check(template: str) -> None:
        with _sandbox() as tmp:
            box = Sandbox(Path(tmp), relative=True)
            model = {k: v for k, v in _BASE_PLAN["model"].items() if k != "name"}
            path = box.root / (box.value(template) + ".json")
            path.write_text(json.dumps(model))
            code, _, err = cli(["recommend-layout", "--model", str(path), "--cluster",
                                 "dgx-h100", "--nodes", "1", "--json"], capsys)
            assert_one_line_error(code, err)
            box.assert_clean()

    check()


# ----- free-form values: quoted ----------------------------------------------------------------


def _write_launch(box: Sandbox, out: Path, script: str, plan_factory: Callable[[], Any],
                  capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    plan_path = box.root / "plan.json"
    plan_path.write_text(plan_json(plan_factory()))
    code, _, err = cli(["launch", str(plan_path), "--out", str(out), "--script", script,
                         "--debug"], capsys)
    return code, err


def _run_every_script(box: Sandbox, out: Path) -> list[list[str]]:
    """launch.sh for node 0 and 1, job.sbatch under the fake srun, then env.sh and
    megatron_args.sh sourced; returns the python argv of the four torchrun starts."""
    for node in ("0", "1"):
        done = box.run(["bash", str(out / "launch.sh"), "--flag", "a b"],
                       {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": node, "PYTHON": "python3"})
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    slurm = {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "host-[a-b]",
             "SLURM_SUBMIT_DIR": str(out), "PYTHON": "python3"}
    done = box.run(["bash", str(out / "job.sbatch")], slurm)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    sourced = box.run(["bash", "-c", 'set -eu; PLACER_NODE_TYPE=box; source "$1/env.sh"; '
                       'source "$1/megatron_args.sh"; printf "%s\\0" "${MEGATRON_ARGS[@]}"',
                       "bash", str(out)], {})
    assert sourced.returncode == 0, sourced.stderr.decode(errors="replace")
    assert b"--tensor-model-parallel-size\x002\x00" in sourced.stdout
    runs = box.calls("python3")
    assert len(runs) == 4, runs
    return runs


def _script_args(argv: list[str]) -> list[str]:
    """What follows torchrun's own flags: the training script and its arguments."""
    return argv[argv.index("--max-restarts") + 2:]


def test_script_path_reaches_torchrun_as_one_unchanged_argument(
        capsys: pytest.CaptureFixture[str]) -> None:
    @SETTINGS
    @given(HOSTILE)
    @example(f"my dir/it's $(touch {MARK}) `touch {MARK}`.py")
    @example(f"-o ProxyCommand=touch {MARK}")  # refused: it would read as an option
    def check(template: str) -> None:
        with _sandbox() as tmp:
            box = Sandbox(Path(tmp))
            script = box.value(template)
            out = box.root / "launch"
            code, err = _write_launch(box, out, script, plan_2x2_tp_intra, capsys)
            if code == 2:  # control characters or a leading '-': refused, nothing written
                assert_one_line_error(code, err)
                assert not out.exists()
                assert any(ord(c) < 32 or c == "\x7f" for c in script) or script[0] == "-"
            else:
                assert code == 0, err
                tails = sorted(_script_args(argv) for argv in _run_every_script(box, out))
                assert tails == sorted([[script], [script], [script, "--flag", "a b"],
                                        [script, "--flag", "a b"]])
            box.assert_clean()

    check()


def test_hostile_output_folder_is_used_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    @SETTINGS
    @given(HOSTILE.filter(lambda s: "/" not in s and s not in (".", "..")))
    @example(f"\ntouch {MARK}\n")  # a trailing newline: $(...) would drop it
    @example(f" $(touch {MARK}) ")
    def check(template: str) -> None:
        with _sandbox() as tmp:
            box = Sandbox(Path(tmp), relative=True)
            out = box.root / box.value(template)
            code, err = _write_launch(box, out, "train.py", plan_2x4_moe_remapped, capsys)
            assert code == 0, err
            for argv in _run_every_script(box, out):
                assert _script_args(argv)[0] == "train.py"
                assert os.environ.get("PLACER_RANKMAP") is None
            box.assert_clean()

    check()


RUNTIME_VARIABLES = ("MASTER_ADDR", "PLACER_LOCAL_ADDR", "PLACER_SCRIPT", "SLURMD_NODENAME",
                     "HOSTNAME", "SANDBOX_HOSTS", "MASTER_PORT", "NODE_RANK", "PET_NODE_RANK",
                     "SLURM_NODEID", "PLACER_NODE_TYPE", "PLACER_RANKMAP", "PYTHONPATH")


def test_hostile_runtime_environment_is_not_executed(capsys: pytest.CaptureFixture[str]) -> None:
    """What Slurm, Kubeflow or the user hand the scripts at run time is data as well."""
    @SETTINGS
    @given(HOSTILE.filter(lambda s: "\0" not in s), st.sampled_from(RUNTIME_VARIABLES))
    def check(template: str, variable: str) -> None:
        with _sandbox() as tmp:
            box = Sandbox(Path(tmp))
            out = box.root / "launch"
            code, err = _write_launch(box, out, "train.py", plan_2x2_tp_intra, capsys)
            assert code == 0, err
            value = box.value(template)
            env = {"MASTER_ADDR": "10.0.0.1", "PYTHON": "python3", variable: value}
            if variable not in ("NODE_RANK", "PET_NODE_RANK", "SLURM_NODEID"):
                env["NODE_RANK"] = "0"
            box.run(["bash", str(out / "launch.sh")], env)
            slurm = {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "host-[a-b]",
                     "SLURM_SUBMIT_DIR": str(out), "PYTHON": "python3", variable: value}
            box.run(["bash", str(out / "job.sbatch")], slurm)
            box.assert_clean()
            if variable in ("MASTER_ADDR", "PLACER_LOCAL_ADDR", "PLACER_SCRIPT"):
                runs = box.calls("python3")
                assert runs and all(value in argv for argv in runs)

    check()


def test_sandbox_detects_an_injection() -> None:
    """The sandbox sees an unquoted value run, so the checks above can fail."""
    with _sandbox() as tmp:
        box = Sandbox(Path(tmp))
        unsafe = box.root / "unsafe.sh"
        unsafe.write_text(f'script={box.value(PAYLOADS[0])}\neval "python3 $script"\n')
        box.run(["bash", str(unsafe)], {})
        with pytest.raises(AssertionError, match="injected"):
            box.assert_clean()
