"""``placer check`` on every file ``placer launch`` writes: no exit 2, no error, and the layout
read back from the framework files is the plan's (the plan is the independent truth here:
check reads the files without knowing the plan)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_cli import cli

from placer.check import CheckOptions, check_paths
from placer.spec import Layout, Plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = ["examples/llama3-70b-8x-dgx-h100/plan.json",
         "examples/mixtral-8x22b-16x-dgx-h100/plan.json"]


@pytest.mark.parametrize("plan_path", PLANS)
def test_emitted_files_pass_check(plan_path: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    plan = Plan.model_validate(json.loads((ROOT / plan_path).read_text()))
    out = tmp_path / "launch"
    code, _, err = cli(["launch", str(ROOT / plan_path), "--out", str(out)], capsys)
    assert code == 0, err
    files = sorted(p for p in out.iterdir() if p.is_file())
    assert len(files) >= 8
    # the framework files name no cluster: --cluster is the plan's (no --nodes, --env, --model)
    report = check_paths(files, CheckOptions(cluster=plan.cluster))
    assert report.problems == [], report.problems
    # check prices torchtitan's files on the torchtitan stack (eager PyTorch modules, FSDP2): a
    # plan searched on another stack's kernels need not fit there; no other error
    errors = [f for f in report.findings if f.severity == "error"]
    for error in errors:
        assert (error.rule_id == "memory-over-capacity"
                and Path(error.file).name.startswith("torchtitan")
                and not (plan.job.stack or "").startswith("torchtitan")), error
    assert report.exit_code == (1 if errors else 0)
    expected = plan.candidates[0].layout
    read = {Path(c.file).name for c in report.configs if c.layout}
    assert {"megatron_args.sh", "torchtitan.toml", "torchtitan_config.py"} <= read
    for config in report.configs:
        if config.kind in ("megatron", "torchtitan") and config.layout:
            got = Layout.parse(config.layout)
            for key in ("tp", "pp", "cp", "ep", "etp", "micro_batch_size"):
                assert getattr(got, key) == getattr(expected, key), (config.file, key)
            # the placer-world line gives the world size: no --nodes needed
            assert config.num_gpus == expected.num_gpus and got.dp == expected.dp, config.file
    # JSON holds no comment line: deepspeed.json states its world size only through
    # train_batch_size, which it leaves out when an mpu derives it (placer.dialects.deepspeed)
    unknown = {Path(f.file).name for f in report.findings if f.rule_id == "world-size-unknown"}
    assert unknown <= {"deepspeed.json"}
