"""What DeepSpeed's optimizer wrappers hold, measured on a real engine on CPU.

``python deepspeed_optimizer_memory.py MANIFEST.json``; each case ``{"id", "config",
"pipeline"}``. One process stands for rank 0 of a 4-rank data-parallel group on the ``fake``
backend (collectives return at once; tests/frameworks/deepspeed_accept.py explains the stubs),
so ``deepspeed.initialize`` builds the wrapper it builds on a GPU cluster, with its partitions
sized for 4 ranks. The model is two bias-free 64x64 linears (8192 parameters), the optimizer
``torch.optim.Adam``; ``pipeline`` wraps them in a one-stage ``PipelineModule`` (the pipeline
engine) and trains two micro-batches with ``train_batch``, else one ``backward`` and ``step``.
Prints, per case: the wrapper's class, its flat buffers (numel, dtype) and the parameters'
``.grad`` dtype after the backward and after the step (null: freed).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
import traceback
from pathlib import Path
from typing import Any

WORLD = 4
BUFFERS = ("fp32_groups_flat_partition", "fp32_groups_gradients_flat",
           "single_partition_of_fp32_groups", "fp32_groups_flat", "fp32_groups")


def _start() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ds_comm = importlib.import_module("deepspeed.comm.comm")
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    ds_torch.build_shm_op = lambda: None
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    ds_comm.cdb = ds_torch.TorchBackend("fake", ds_comm.default_pg_timeout, None)


def _grads(module: Any) -> list[str | None]:
    return [None if p.grad is None else str(p.grad.dtype) for p in module.parameters()]


def measure(case: dict[str, Any]) -> dict[str, Any]:
    import deepspeed
    import torch
    from deepspeed.pipe import PipelineModule

    layers = [torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False)]
    config = {**case["config"], "train_micro_batch_size_per_gpu": 1,
              "zero_allow_untested_optimizer": True}
    if case["pipeline"]:
        config["gradient_accumulation_steps"] = 2
        model: torch.nn.Module = PipelineModule(
            layers=layers, num_stages=1, loss_fn=lambda out, _: out.float().pow(2).mean())
    else:
        model = torch.nn.Sequential(*layers)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.Adam(model.parameters()), config=config)
    optimizer = engine.optimizer
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    if case["pipeline"]:
        engine.train_batch(iter([(x, torch.zeros(1))] * 2))
        after_backward = None
    else:
        engine.backward(engine(x).float().pow(2).mean())
        after_backward = _grads(engine.module)
        engine.step()
    buffers = {}
    for name in BUFFERS:
        value = getattr(optimizer, name, None)
        if isinstance(value, list) and value and all(isinstance(t, torch.Tensor) for t in value):
            buffers[name] = [[t.numel(), str(t.dtype).removeprefix("torch.")] for t in value]
    return {"id": case["id"], "wrapper": type(optimizer).__name__, "buffers": buffers,
            "after_backward": after_backward, "after_step": _grads(engine.module)}


def main() -> None:
    _start()
    for case in json.loads(Path(sys.argv[1]).read_text()):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                result = measure(case)
        except Exception:
            result = {"id": case["id"], "error": traceback.format_exc()}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
