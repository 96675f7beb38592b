"""ZeRO-3 training state under PyTorch FSDP against PyTorch: FSDP1 and FSDP2 shard one fp32
parameter, which is the master copy, and keep no bf16 shard beside it (tests/torch_fsdp_state.py
measures the live storages after two AdamW steps on 4 fake ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed.fsdp")

from placer.cost.memory import sharded_weight_bytes  # noqa: E402
from placer.cost.options import CostOptions  # noqa: E402
from placer.spec.job import Optimizer  # noqa: E402

WORKER = Path(__file__).with_name("torch_fsdp_state.py")


@pytest.fixture(scope="module")
def measured() -> dict[str, dict[str, object]]:
    done = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True,
                          timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_pytorch_fsdp_keeps_the_fp32_shard_as_master(
        kind: str, measured: dict[str, dict[str, object]]) -> None:
    adam = Optimizer()  # bf16 working weights, fp32 gradients, fp32 master and moments
    fsdp = (sharded_weight_bytes(adam, CostOptions(fsdp_sharded_master=True))
            + adam.grad_bytes + adam.sharded_state_bytes)
    other = (sharded_weight_bytes(adam, CostOptions())
             + adam.grad_bytes + adam.sharded_state_bytes)
    # AdamW's step counters (one fp32 scalar per parameter tensor) and FSDP2's int32 bookkeeping
    # are the only other storages: a few bytes, not a bf16 shard.
    assert measured[kind]["bytes_per_param"] == pytest.approx(fsdp, abs=0.01)
    assert "torch.bfloat16" not in measured[kind]["dtypes"]
    assert other == fsdp + adam.param_bytes  # a stack with a working-dtype shard keeps more
