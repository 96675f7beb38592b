"""Which optimizer wrapper DeepSpeed's engine picks for a config, by DeepSpeed's own code.

``python deepspeed_optimizer_select.py MANIFEST.json``; each case ``{"id", "config",
"pipeline"}``. The config is parsed by DeepSpeed's ``DeepSpeedConfig`` and the choice is
``DeepSpeedEngine._do_optimizer_sanity_check`` itself, called on an engine object that holds
only that config (``__new__`` without ``__init__``: building a real engine would start the
model, its optimizer and process groups; the selection reads nothing else) plus
``pipeline_parallelism`` (what PipelineEngine sets) and ``global_rank``. The process group is
the ``fake`` backend of one rank (tests/frameworks/deepspeed_accept.py explains the stubs).
Prints one JSON line per case: the wrapper constant and ZeRO stage, or DeepSpeed's error.
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


def _start() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ds_comm = importlib.import_module("deepspeed.comm.comm")
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    ds_torch.build_shm_op = lambda: None
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    ds_comm.cdb = ds_torch.TorchBackend("fake", ds_comm.default_pg_timeout, None)


def select(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine

    config = DeepSpeedConfig(case["config"])
    engine = DeepSpeedEngine.__new__(DeepSpeedEngine)
    for name, value in (("_config", config), ("pipeline_parallelism", case["pipeline"]),
                        ("global_rank", 0)):
        object.__setattr__(engine, name, value)
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    try:
        wrapper = engine._do_optimizer_sanity_check(optimizer)
    except (NotImplementedError, ValueError, AssertionError) as exc:
        return {"id": case["id"], "error": f"{type(exc).__name__}: {exc}"}
    return {"id": case["id"], "wrapper": wrapper,
            "zero_stage": int(config.zero_optimization_stage)}


def main() -> None:
    _start()
    for case in json.loads(Path(sys.argv[1]).read_text()):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                result = select(case)
        except Exception:
            result = {"id": case["id"], "error": traceback.format_exc()}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
