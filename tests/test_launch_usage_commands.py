"""The usage lines in the generated files' headers run as written (placeholders filled in).

Each header's command is cut out of the file, run by bash from the launch directory with a
stand-in ``python`` that prints its argv (no GPUs here), and the torchrun command line launch.sh
builds is parsed by torchrun's own argument parser: the training script and its arguments must
be what the header promises.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from helpers_launch import plan_2x2_tp_intra
from test_launch_scripts import FAKE_PYTHON
from torch.distributed.run import get_args_parser

from placer.launch import write_launch_files

# Placeholders a header shows in <...>, and what this test puts there.
FILLED = {"<model and data arguments>": "--num-layers 2"}


def _usage(text: str) -> str:
    """The header's command lines: indented four or more spaces (wrapped text gets two)."""
    if text.startswith('"""'):  # a Python module: its docstring
        lines = text.split('"""')[1].splitlines()
    else:  # a shell file: its comment lines
        lines = [line[2:] for line in text.splitlines() if line.startswith("# ")]
    command = "\n".join(line.strip() for line in lines if re.match(r"^ {4}\S", line))
    for placeholder, value in FILLED.items():
        command = command.replace(placeholder, value)
    return command


def _torchrun(folder: Path, tmp_path: Path, command: str):  # noqa: ANN202
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "PYTHON": str(fake), "NODE_RANK": "0",
           "MASTER_ADDR": "127.0.0.1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    argv = [line[4:] for line in done.stdout.splitlines() if line.startswith("ARG ")]
    assert argv[:2] == ["-m", "torch.distributed.run"], argv
    return get_args_parser().parse_args(argv[2:])


def test_megatron_usage_runs_pretrain_with_the_flags(tmp_path: Path) -> None:
    folder = tmp_path / "launch"
    write_launch_files(plan_2x2_tp_intra(), 0, folder)
    text = (folder / "megatron_args.sh").read_text()
    command = _usage(text)
    assert command.startswith("source megatron_args.sh")
    args = _torchrun(folder, tmp_path, command)
    assert args.training_script == "pretrain_gpt.py" and not args.module
    script_args = args.training_script_args
    assert script_args[:2] == ["--tensor-model-parallel-size", "2"]
    assert script_args[-2:] == ["--num-layers", "2"]


def test_torchtitan_usage_runs_torchtitans_trainer_module(tmp_path: Path) -> None:
    folder = tmp_path / "launch"
    write_launch_files(plan_2x2_tp_intra(), 0, folder)
    text = (folder / "torchtitan_config.py").read_text()
    command = _usage(text)
    args = _torchrun(folder, tmp_path, command)
    # torchrun's -m: run torchtitan.train as a module, with torchtitan's config arguments.
    assert args.module and args.training_script == "torchtitan.train"
    assert args.training_script_args == ["--module", "torchtitan_config", "--config",
                                         "placer_job"]
