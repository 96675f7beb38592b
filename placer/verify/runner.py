"""Where calibration and replay workers run: an emulated cluster or one local torchrun.

Both launchers give every launch a wall-clock limit; a run that passes it has its whole process
tree killed and is reported as ``timeout``, a run that exits non-zero as ``failed`` with the end
of its log, so one hung candidate never stops the others.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from placer.errors import PlacerError
from placer.verify.emulate import EmulatedCluster, EmulationError

RunStatus = Literal["ok", "timeout", "failed"]
LOG_TAIL_LINES = 15
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class RunResult:
    """How one torchrun launch ended."""

    status: RunStatus
    exit_codes: tuple[int, ...]
    wall_s: float
    log_tail: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _log_tail(log_dir: Path) -> str:
    """The last lines of every node's log, errors first: what a user needs to see a crash."""
    lines: list[str] = []
    for path in sorted(log_dir.glob("node*.log")):
        text = path.read_text(errors="replace").splitlines()
        errors = [ln for ln in text if "Error" in ln or "error:" in ln]
        tail = errors[-3:] + text[-LOG_TAIL_LINES:]
        lines += [f"[{path.stem}] {ln}" for ln in dict.fromkeys(tail)]
    return "\n".join(lines)


def _result(codes: list[int], deadline_hit: bool, start: float, log_dir: Path) -> RunResult:
    wall = time.monotonic() - start
    if deadline_hit:
        return RunResult("timeout", tuple(codes), wall, _log_tail(log_dir))
    status: RunStatus = "ok" if all(c == 0 for c in codes) else "failed"
    return RunResult(status, tuple(codes), wall, "" if status == "ok" else _log_tail(log_dir))


class Launcher(ABC):
    """Runs one worker script on ``num_nodes`` x ``gpus_per_node`` ranks per call of :meth:`run`."""

    num_nodes: int
    gpus_per_node: int
    description: str
    backend: str = "auto"  # what the workers use: "auto" is NCCL on CUDA, else gloo

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @abstractmethod
    def run(self, script_argv: list[str], log_dir: Path, timeout_s: float,
            env: dict[str, str] | None = None) -> RunResult:
        """Run ``script_argv`` on every rank; logs go to ``log_dir/node<i>.log``."""

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:  # noqa: B027 - most launchers hold nothing
        """Release what the launcher holds (namespaces); idempotent."""


class EmulatedLauncher(Launcher):
    """One torchrun per network namespace of an :class:`EmulatedCluster` (gloo on CPU)."""

    backend = "gloo"  # the shaped links carry TCP; NCCL on a GPU box would bypass them

    def __init__(self, num_nodes: int, gpus_per_node: int, inter_node_mbit: float | None,
                 base_port: int = 29600, burst_bytes: int | None = None) -> None:
        ok, why = EmulatedCluster.available()
        if not ok:
            raise PlacerError(f"--emulate: cannot emulate a cluster here: {why}")
        self.num_nodes, self.gpus_per_node = num_nodes, gpus_per_node
        self.inter_node_mbit = inter_node_mbit
        rate = "unshaped" if inter_node_mbit is None else f"{inter_node_mbit:g} Mbit/s tbf"
        self.description = (f"emulated {num_nodes} nodes x {gpus_per_node} ranks "
                            f"(network namespaces, {rate} between nodes, gloo on CPU)")
        self._ports = itertools.count(base_port)
        self.cluster = EmulatedCluster(num_nodes, inter_node_mbit, burst_bytes=burst_bytes)
        try:
            self.cluster.start()
        except EmulationError as exc:
            raise PlacerError(f"--emulate: setting up the emulated cluster failed: {exc}") from None

    def run(self, script_argv: list[str], log_dir: Path, timeout_s: float,
            env: dict[str, str] | None = None) -> RunResult:
        start = time.monotonic()
        try:
            procs = self.cluster.launch_torchrun(
                script_argv, self.gpus_per_node, next(self._ports), dict(env or {}), log_dir)
        except EmulationError as exc:  # torn down by a signal while running
            raise PlacerError(f"--emulate: {exc}") from None
        codes = self.cluster.wait(procs, timeout_s)
        hit = time.monotonic() - start >= timeout_s and any(c != 0 for c in codes)
        return _result(codes, hit, start, log_dir)

    def close(self) -> None:
        self.cluster.close()


class LocalLauncher(Launcher):
    """``torchrun --standalone`` on this machine: NCCL when CUDA is present, else gloo."""

    def __init__(self, nproc: int) -> None:
        if nproc < 1:
            raise PlacerError(f"--nproc: {nproc} is not valid; use at least 1 process")
        self.num_nodes, self.gpus_per_node = 1, nproc
        self.description = f"this machine, {nproc} ranks (torchrun --standalone)"

    def command(self, script_argv: list[str]) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(self.gpus_per_node), "--max-restarts", "0", *script_argv]

    def run(self, script_argv: list[str], log_dir: Path, timeout_s: float,
            env: dict[str, str] | None = None) -> RunResult:
        log_dir.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                    **(env or {})}
        start = time.monotonic()
        with open(log_dir / "node0.log", "wb") as log:
            # Own session, so a timeout can kill torchrun and the workers it starts.
            proc = subprocess.Popen(self.command(script_argv), stdout=log,
                                    stderr=subprocess.STDOUT, env=full_env,
                                    start_new_session=True)
            hit = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                hit = True
            finally:
                if proc.poll() is None:
                    _kill_tree(proc)
        return _result([int(proc.returncode)], hit, start, log_dir)


def _kill_tree(proc: subprocess.Popen[Any]) -> None:
    """torchrun puts its workers in sessions of their own: kill through the process tree.

    Reuses the emulated cluster's tree killer (pid + start-time checked, TERM then KILL).
    """
    with contextlib.suppress(ProcessLookupError):
        EmulatedCluster._kill([proc], KILL_GRACE_S)


def torchrun_hint(nodes: int, gpus_per_node: int, script_argv: list[str]) -> str:
    """The command a user runs on each node of a real cluster, with their own rendezvous."""
    argv = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(gpus_per_node),
            "--node-rank", "$NODE_RANK", "--rdzv-backend", "static",
            "--master-addr", "$MASTER_ADDR", "--master-port", "29500", *script_argv]
    return " ".join(a if a.startswith("$") else shlex.quote(a) for a in argv)
