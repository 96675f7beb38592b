"""``placer check`` judges a foreign launch script's memory with the allocator it really runs.

PyTorch reads its caching-allocator settings from PYTORCH_ALLOC_CONF, else the older
PYTORCH_CUDA_ALLOC_CONF (c10/core/AllocatorConfig.h, torch 2.13), as comma-separated
``key:value`` pairs whose ``expandable_segments`` takes exactly ``True`` or ``False``. A script
that exports neither runs the plain caching allocator, so its memory keeps GMLake's
fragmentation allowance; placer's own launch exports expandable segments and is planned
without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placer.check import CheckOptions, check_paths, read_config
from placer.cost.memory import FRAGMENTATION_FRACTION_NO_RECOMPUTE
from placer.spec.presets import load_cluster
from placer.spec.runtime import alloc_conf_expandable

CORPUS = Path(__file__).resolve().parent / "data" / "check_corpus"
# NVIDIA/Megatron-LM@d98e8a64 examples/llama/train_llama3_8b_h100_fp8.sh (exports no allocator
# settings): 8 H100, TP1 PP1 DP8, sequence 8192.
NVIDIA_8B = CORPUS / "megatron" / "llama3_8b_h100_fp8.sh"
SCRIPT = """#!/bin/bash
{line}
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 \\
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 \\
    --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64
"""


@pytest.mark.parametrize(("env", "expected"), [
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512, expandable_segments:True"}, True),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"}, False),  # c10 refuses 'true'
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}, False),
    # the primary variable wins over the older one
    ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:512",
      "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, False),
    ({}, False),
])
def test_allocator_variables_as_pytorch_reads_them(env: dict[str, str], expected: bool) -> None:
    assert alloc_conf_expandable(env) is expected


@pytest.mark.parametrize(("line", "expected"), [
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", True),
    ('export PYTORCH_ALLOC_CONF="expandable_segments:True"', True),
    ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\nexport PYTORCH_CUDA_ALLOC_CONF", True),
    # set but never exported: torchrun does not see it
    ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", False),
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False", False),
    ("", False),
])
def test_a_script_runs_expandable_segments_only_when_it_exports_them(
        tmp_path: Path, line: str, expected: bool) -> None:
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(line=line))
    assert read_config(path).settings.expandable_segments is expected


def test_an_allocator_given_with_env_counts_as_the_scripts_environment(tmp_path: Path) -> None:
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(line=""))
    given = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert read_config(path, given).settings.expandable_segments is True


def _peak_gib(env: tuple[tuple[str, str], ...]) -> tuple[float | None, list[str]]:
    """The memory finding's predicted peak (None: no finding) and the summary's notes."""
    options = CheckOptions(cluster=load_cluster("dgx-h100"), env=env)
    report = check_paths([NVIDIA_8B], options)
    notes = report.configs[0].notes
    found = [f for f in report.findings if f.rule_id == "memory-over-capacity"]
    if not found:
        return None, notes
    return float(found[0].message.split("predicted peak ")[1].split(" GiB")[0]), notes


def test_nvidias_8b_script_keeps_the_fragmentation_allowance_it_ran_with() -> None:
    """The script exports no allocator settings: checked as it ran, it fits the 79.6 GiB of an
    H100 only inside placer's planning headroom (a warning, not an error); with expandable
    segments in its environment the allowance goes and it fits the headroom too."""
    caching, notes = _peak_gib(())
    assert caching is not None and 71.7 < caching < 79.6
    assert any("no expandable segments" in n for n in notes)
    options = CheckOptions(cluster=load_cluster("dgx-h100"))
    message = check_paths([NVIDIA_8B], options).findings[0].message
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in message  # the fix
    stitched, notes = _peak_gib((("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),))
    assert stitched is None
    assert any(n.startswith("allocator: expandable segments") for n in notes)


def test_an_argument_file_is_judged_as_its_launcher_runs_it(tmp_path: Path) -> None:
    """A file of flag arrays that no command in it uses (placer's megatron_args.sh, which
    launch.sh sources after env.sh exports expandable segments) starts no process: its
    allocator is its launcher's, so it is checked as placer's launch runs it, unless --env says
    what the launcher sets."""
    path = tmp_path / "megatron_args.sh"
    path.write_text("PARALLEL=(--tensor-model-parallel-size 2 --micro-batch-size 1)\n")
    assert read_config(path).settings.expandable_segments is None
    given = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    assert read_config(path, given).settings.expandable_segments is False


def test_megatrons_te_cross_entropy_flags_are_read(tmp_path: Path) -> None:
    """--cross-entropy-fusion-impl te picks Transformer Engine's loss kernel only together with
    --cross-entropy-loss-fusion (megatron-core LanguageModule.compute_language_model_loss); the
    checked job then keeps the bf16 logits, so NVIDIA's 8B script's peak drops by 4 bytes per
    logit entry of its 8192 x 128256 local logits."""
    path = tmp_path / "train.sh"
    both = "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te"
    for flags, impl in ((both, "te"), ("--cross-entropy-fusion-impl te", "native"),
                        ("--cross-entropy-loss-fusion", "native")):
        path.write_text(SCRIPT.format(line="").replace("--global-batch-size 64",
                                                       f"--global-batch-size 64 {flags}"))
        assert read_config(path).settings.cross_entropy_impl == impl, flags
    text = NVIDIA_8B.read_text().replace("--cross-entropy-loss-fusion", both)
    copy = tmp_path / NVIDIA_8B.name
    copy.write_text(text)
    # judged on 40 GB GPUs, where both peaks exceed the capacity and so are reported
    small = CheckOptions(cluster=load_cluster("dgx-a100-40gb"))
    native, te = (float(check_paths([p], small).findings[0].message.split(
        "predicted peak ")[1].split(" GiB")[0]) for p in (NVIDIA_8B, copy))
    # 4 B x 8192 x 128256 = 3.9 GiB, plus the fragmentation allowance's f / (1 - f) of it (the
    # script recomputes nothing)
    f = FRAGMENTATION_FRACTION_NO_RECOMPUTE
    assert native - te == pytest.approx(4 * 8192 * 128256 / 2**30 / (1 - f), abs=0.1)
