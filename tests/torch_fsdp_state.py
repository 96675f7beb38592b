"""What PyTorch FSDP keeps between steps, measured: ``python torch_fsdp_state.py``.

Three bias-free linear layers are sharded over 4 ranks of the ``fake`` process-group backend
(collectives are no-ops, shapes and sharding are real), with bf16 mixed precision and fp32
reduction as torchtitan and llm-foundry configure it, and trained two steps with AdamW. Every
tensor storage the run left alive is then counted once, for FSDP1 and then FSDP2. Prints one
JSON line: per kind, the bytes per parameter of the rank's shard and the dtypes that hold them.
"""

from __future__ import annotations

import gc
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.testing._internal.distributed.fake_pg import FakeStore

WORLD = 4
WIDTH = 512
LAYERS = 3


def _shard(model: nn.Sequential, kind: str) -> nn.Module:
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (WORLD,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        return fully_shard(model, mesh=mesh, mp_policy=policy)
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"))


def _live_storages() -> dict[int, tuple[int, str]]:
    seen: dict[int, tuple[int, str]] = {}
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor):
            continue
        tensor = getattr(obj, "_local_tensor", obj)  # a DTensor's shard
        storage = tensor.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = (storage.nbytes(), str(tensor.dtype))
    return seen


def measure(kind: str) -> dict[str, object]:
    gc.collect()
    before = set(_live_storages())  # what an earlier kind left behind is not this one's
    torch.manual_seed(0)
    model = _shard(nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False)
                                   for _ in range(LAYERS)]), kind)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(8, WIDTH)).float().sum().backward()
        optimizer.step()
    gc.collect()
    storages = {ptr: held for ptr, held in _live_storages().items() if ptr not in before}
    shard_params = LAYERS * WIDTH * WIDTH / WORLD
    total = sum(nbytes for nbytes, _ in storages.values())
    del model, optimizer
    gc.collect()
    return {"bytes_per_param": total / shard_params,
            "dtypes": sorted({dtype for _, dtype in storages.values()})}


def main() -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    print(json.dumps({kind: measure(kind) for kind in ("fsdp1", "fsdp2")}))


if __name__ == "__main__":
    main()
