"""Load placer's deepspeed.json with DeepSpeed's own DeepSpeedConfig, with and without an mpu.

``python deepspeed_accept.py MANIFEST.json``; each case ``{"id", "dir", "world_size", "dp",
"pp"}``.
DeepSpeedConfig reads the world size from ``deepspeed.comm``, so each case starts a process
group of the plan's world size on the ``fake`` backend (stub a CPU-only machine forces: no
NCCL, one process stands for every rank). The mpu is a stand-in with the one method
DeepSpeedConfig calls, ``get_data_parallel_world_size()``, returning the plan's dp (Megatron's
mpu needs initialised NCCL groups). DeepSpeed's CPU accelerator would JIT-compile its
shared-memory all-reduce kernel (C++, minutes) when the communication backend starts; that
kernel holds no config logic, so ``build_shm_op`` returns None, DeepSpeed's own answer when the
op is not compatible. Prints one JSON line per case: the batch settings DeepSpeed
derived, or its error, for each of the two ways; and the gradient accumulation DeepSpeed's
engine resolves from the file (``DeepSpeedEngine.get_data_types``, and the optimizer wrapper
``_do_optimizer_sanity_check`` then picks, or its refusal), called on an engine shell that holds
only the config, as tests/frameworks/deepspeed_optimizer_select.py does.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path
from typing import Any


class DataParallelMpu:
    """Stand-in mpu: the data-parallel size of the plan (see the module docstring)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _config(path: Path, mpu: Any) -> dict[str, Any]:
    from deepspeed.runtime.config import DeepSpeedConfig
    try:
        config = DeepSpeedConfig(str(path), mpu=mpu)
    except (AssertionError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"world_size": config.world_size, "train_batch_size": config.train_batch_size,
            "micro": config.train_micro_batch_size_per_gpu,
            "accumulation": config.gradient_accumulation_steps,
            "zero_stage": int(config.zero_optimization_stage),
            "bf16": config.bfloat16_config.enabled}


def _accumulation(path: Path, pipeline: bool) -> dict[str, Any]:
    import torch
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine

    config = DeepSpeedConfig(str(path))
    engine = DeepSpeedEngine.__new__(DeepSpeedEngine)
    for name, value in (("_config", config), ("pipeline_parallelism", pipeline),
                        ("global_rank", 0)):
        object.__setattr__(engine, name, value)
    _, accumulation = engine.get_data_types()
    out: dict[str, Any] = {"raw": config.grad_accum_dtype,
                           "bytes": torch.empty(0, dtype=accumulation).element_size()}
    try:
        out["wrapper"] = engine._do_optimizer_sanity_check(
            torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))]))
    except (NotImplementedError, ValueError, AssertionError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def check(case: dict[str, Any]) -> dict[str, Any]:
    import importlib

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    # Modules by name: the deepspeed.comm package's "torch" attribute is torch itself.
    ds_comm = importlib.import_module("deepspeed.comm.comm")
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    ds_torch.build_shm_op = lambda: None  # see the module docstring

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case["world_size"])
    # What deepspeed.comm.init_distributed does when torch.distributed is already initialised
    # (comm.py: "The user initialized torch.dist themselves, create cdb"), without first
    # starting the CPU accelerator's oneCCL backend.
    ds_comm.cdb = ds_torch.TorchBackend("fake", ds_comm.default_pg_timeout, None)
    path = Path(case["dir"], "deepspeed.json")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return {"id": case["id"], "with_mpu": _config(path, DataParallelMpu(case["dp"])),
                "without_mpu": _config(path, None),
                "accumulation": _accumulation(path, case["pp"] > 1)}


def main() -> None:
    for case in json.loads(Path(sys.argv[1]).read_text()):
        try:
            result = check(case)
        except Exception:
            result = {"id": case["id"], "error": traceback.format_exc()}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
