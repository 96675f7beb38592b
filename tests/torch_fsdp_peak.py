"""Where forward + backward peaks under PyTorch FSDP2, measured:
``python torch_fsdp_peak.py VOCAB [single,fsdp2]``.

Eager Llama blocks (tests/torch_blocks.py, full recomputation) between an embedding and a final
norm + output layer, with an fp32 cross-entropy as torchtitan runs it, once on one process and
once under FSDP2 wrapped as torchtitan wraps it (torchtitan@9dec370
torchtitan/parallelisms/parallelize_llama.py apply_fsdp: each block a unit, resharded after
forward but the last, the root holding the embedding, norm and output; bf16 parameters, fp32
reduction) on 4 ranks of the ``fake`` process-group backend, all under FakeTensorMode. Prints
one JSON line: per kind, the bytes by category of ``FSDPMemTracker`` / ``MemTracker`` at the
step's peak.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch_blocks import BF16, Block, BlockShape, run_layer

WORLD = 4
SEQ, BATCH, LAYERS = 1024, 2, 3
SHAPE = BlockShape(512, 8, 2, 64, 1408, fused=False)


class Llama(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, SHAPE.hidden, dtype=BF16)
        self.layers = nn.ModuleList([Block(SHAPE, SEQ) for _ in range(LAYERS)])
        self.norm = nn.RMSNorm(SHAPE.hidden, dtype=BF16)
        self.output = nn.Linear(SHAPE.hidden, vocab, bias=False, dtype=BF16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(ids)
        for block in self.layers:
            x = run_layer(block, x, "full")
        return self.output(self.norm(x))


def _step(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> None:
    pred = model(ids)
    loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
    del pred  # as torchtitan's train step does before backward
    loss.backward()


def measure(kind: str, vocab: int, mesh: DeviceMesh) -> dict[str, float]:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = Llama(vocab)
    if kind == "fsdp2":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, block in enumerate(model.layers):
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < LAYERS - 1)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    ids = torch.randint(0, vocab, (BATCH, SEQ))
    labels = torch.randint(0, vocab, (BATCH, SEQ))
    _step(model, ids, labels)  # the gradients exist from the first step on
    if kind == "fsdp2":
        tracker: MemTracker = FSDPMemTracker(model)
    else:
        tracker = MemTracker()
        tracker.track_external(model)
    with tracker:
        _step(model, ids, labels)
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {str(category).split(".")[-1]: float(nbytes) for category, nbytes in peak.items()}


def main() -> None:
    vocab = int(sys.argv[1])
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    out = {}
    for kind in (sys.argv[2] if len(sys.argv) > 2 else "single,fsdp2").split(","):
        with FakeTensorMode():
            out[kind] = measure(kind, vocab, mesh)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
