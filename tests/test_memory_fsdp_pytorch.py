"""ZeRO-3 training state under PyTorch FSDP against PyTorch: FSDP1 and FSDP2 shard one fp32
parameter, which is the master copy, and keep no bf16 shard beside it (tests/torch_fsdp_state.py
measures the live storages after two AdamW steps on 4 fake ranks), and where FSDP2's step peaks
and what it holds unsharded there (tests/torch_fsdp_peak.py)."""

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


PEAK_WORKER = Path(__file__).with_name("torch_fsdp_peak.py")


def _peaks(vocab: int, kinds: str = "single,fsdp2") -> dict[str, dict[str, float]]:
    done = subprocess.run([sys.executable, str(PEAK_WORKER), str(vocab), kinds],
                          capture_output=True, text=True, timeout=180, check=False,
                          cwd=PEAK_WORKER.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _param_counts(vocab: int) -> tuple[int, int]:
    """(one block's, the root unit's) parameters in tests/torch_fsdp_peak.py, by hand."""
    h, heads, kv, d, ffn = 512, 8, 2, 64, 1408
    block = 2 * h * heads * d + 2 * h * kv * d + 3 * h * ffn + 2 * h  # q, o; k, v; MLP; norms
    return block, 2 * vocab * h + h  # embedding, output, final norm


def test_fsdp2_peaks_at_the_loss_with_only_the_root_and_the_last_block_gathered() -> None:
    """A vocabulary whose loss backward outweighs a layer's: under FSDP2 the activations and
    temporaries at the peak are the single process's (the same moment, the loss backward:
    memory.py adds no layer backward there), and FSDP2 holds unsharded only the root unit
    (kept after forward) and the last block (torchtitan does not reshard it): nothing is
    prefetched or reduce-scattered yet."""
    vocab = 8000
    peaks = _peaks(vocab)
    block, root = _param_counts(vocab)
    assert peaks["fsdp2"]["ACT"] == peaks["single"]["ACT"]
    assert peaks["fsdp2"]["TEMP"] == peaks["single"]["TEMP"]
    assert peaks["fsdp2"]["UNSHARDED_PARAM"] == 2 * (root + block)
    assert peaks["fsdp2"]["ALL_GATHER"] == 0 == peaks["fsdp2"]["REDUCE_SCATTER"]


def test_fsdp2_peaks_in_a_layer_backward_with_the_next_block_prefetched() -> None:
    """A small vocabulary: the peak is inside a block's backward, with that block and the
    root unsharded, the next block's all-gather (backward prefetch) and the block's fp32
    gradients in the reduce-scatter buffer: the current-plus-prefetched unit and one unit's
    gradients that memory._zero3_transient counts."""
    vocab = 1000
    peaks = _peaks(vocab, "fsdp2")["fsdp2"]
    block, root = _param_counts(vocab)
    assert peaks["UNSHARDED_PARAM"] == 2 * (root + block)
    assert peaks["ALL_GATHER"] == 2 * block
    assert peaks["REDUCE_SCATTER"] == 4 * block
