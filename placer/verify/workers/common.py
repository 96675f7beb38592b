"""What the calibration and replay workers share: process-group setup, timing, collectives.

Runs inside torchrun processes. It imports only torch and the standard library, so a worker is a
faithful test of the launch environment (the same imports a user's training script makes).

Message sizes follow nccl-tests (docs/sources.md section 4): ``nbytes`` is the all-reduce buffer,
the all-gather *output*, the reduce-scatter *input*, the all-to-all per-rank buffer, and the
send/recv message.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from placer.verify.workers.sizes import ELEMENT_BYTES, elements_for

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


@dataclass(frozen=True)
class Runtime:
    """This process's place in the job and the device its tensors live on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def init_runtime(backend: str = "auto", timeout_s: float = 300.0) -> Runtime:
    """Init the default group from torchrun's environment: NCCL on CUDA, else gloo."""
    use_cuda = torch.cuda.is_available() and backend in ("auto", "nccl")
    chosen = "nccl" if use_cuda else "gloo"
    if backend not in ("auto", chosen):
        raise RuntimeError(f"backend {backend!r} is not usable here (CUDA: {use_cuda})")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend=chosen, timeout=timedelta(seconds=timeout_s))
    return Runtime(dist.get_rank(), dist.get_world_size(), local, device, chosen)


def mesh_from_config(config: dict[str, Any]) -> Any:
    """placer_mesh from the candidate's launch folder (``config["job_dir"]``), set up as a
    training job would: the groups of its rank map, gloo or NCCL as the config says."""
    job_dir = Path(config["job_dir"])
    sys.path.insert(0, str(job_dir))
    placer_mesh = importlib.import_module("placer_mesh")
    backend = None if config.get("backend", "auto") == "auto" else config["backend"]
    return placer_mesh.setup(job_dir / "rankmap.json", backend=backend,
                             timeout_s=config["timeout_s"])


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so wall-clock time covers it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(group: dist.ProcessGroup | None, device: torch.device) -> None:
    if device.type == "cuda":
        dist.barrier(group=group, device_ids=[device.index])
    else:
        dist.barrier(group=group)


def max_over(value: float, group: dist.ProcessGroup | None, device: torch.device) -> float:
    """The largest ``value`` over ``group``: the time of a collective step is its slowest rank."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return float(tensor.item())


def make_collective(
    collective: str,
    nbytes: int,
    group: dist.ProcessGroup,
    group_ranks: list[int],
    rank: int,
    device: torch.device,
    peer: int | None = None,
) -> tuple[Callable[[], None], int]:
    """A zero-argument function issuing one blocking ``collective`` of ``nbytes`` on ``group``.

    Buffers are allocated once, here, so the timed calls measure only communication. Returns the
    function and the byte count it really moves (rounded to whole elements per rank). For
    ``send_recv``, ``peer`` is the other global rank; the lower group member sends.
    """
    p = len(group_ranks)
    n = elements_for(nbytes, 1 if collective == "send_recv" else p)
    real_bytes = n * ELEMENT_BYTES
    full = torch.ones(n, dtype=torch.float32, device=device)
    if collective == "all_reduce":
        return (lambda: dist.all_reduce(full, group=group)), real_bytes
    if collective == "all_gather":
        part = torch.ones(n // p, dtype=torch.float32, device=device)
        return (lambda: dist.all_gather_into_tensor(full, part, group=group)), real_bytes
    if collective == "reduce_scatter":
        part = torch.empty(n // p, dtype=torch.float32, device=device)
        return (lambda: dist.reduce_scatter_tensor(part, full, group=group)), real_bytes
    if collective == "all_to_all":
        out = torch.empty(n, dtype=torch.float32, device=device)
        return (lambda: dist.all_to_all_single(out, full, group=group)), real_bytes
    if collective == "send_recv":
        if peer is None:
            raise ValueError("send_recv needs a peer rank")
        if rank < peer:
            return (lambda: dist.send(full, dst=peer)), real_bytes
        return (lambda: dist.recv(full, src=peer)), real_bytes
    raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")


def gemm_call(n: int, dtype: torch.dtype, device: torch.device) -> Callable[[], None]:
    """One ``n x n x n`` matrix multiply into a preallocated output (2 n^3 FLOPs)."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    return lambda: torch.matmul(a, b, out=out)


def gemm_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs (the precision training runs in); fp32 on CPUs, where bf16 GEMMs are fast
    only on cores with AVX-512 BF16 and a portable calibration must not depend on that."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def timed(call: Callable[[], None], count: int, device: torch.device) -> float:
    """Wall seconds for ``count`` back-to-back calls, GPU work included."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(count):
        call()
    synchronize(device)
    return time.perf_counter() - start


def write_json(path: Path, data: Any) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a result."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)
