"""Candidates as Slurm jobs: submit each one's ``job.sbatch``, poll, time out, collect.

Every candidate is its own batch job, submitted from its launch folder (``placer launch``'s
files, so the job also proves them): ``sbatch [options] job.sbatch CONFIG OUT`` with
``PLACER_SCRIPT`` naming the worker, which ``launch.sh`` runs under torchrun on every node. The
jobs are submitted together and Slurm runs them as nodes free up; ``--exclusive`` keeps two
candidates off the same node, so neither's timing includes the other's.

State comes from the client commands a user has: ``squeue`` for queued and running jobs, then
``scontrol show job`` (slurmctld keeps ended jobs ``MinJobAge`` seconds) and ``sacct`` (when
accounting is on) for how a job ended. Each candidate's time limit runs from when its job starts
(time in the queue is not the candidate's): past it, ``scancel`` and the candidate is reported
``timeout``. Job ids are written to ``candidate<i>/slurm.json`` so a rerun re-attaches to jobs
still queued or running instead of submitting them again.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from placer.errors import PlacerError

# squeue(1) / sacct(1) "JOB STATE CODES" after which a job never runs again.
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "REVOKED", "TIMEOUT"})
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol")
COMMAND_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SlurmOptions:
    """What ``verify --slurm`` adds to every sbatch call."""

    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # sbatch --time; default: the candidate limit + 2 minutes
    sbatch_args: tuple[str, ...] = ()
    exclusive: bool = True
    poll_s: float = 2.0


@dataclass(frozen=True)
class JobEnd:
    """How a job ended (or that it has not): Slurm's state, exit code, reason."""

    state: str
    exit_code: str = ""
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES


def scontrol_fields(line: str) -> dict[str, str]:
    """``scontrol show job -o``: space-separated Key=Value pairs on one line."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


class SlurmClient:
    """The Slurm client commands, with their failures turned into one-line errors."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        missing = [c for c in CLIENTS if shutil.which(c, path=(env or os.environ).get("PATH"))
                   is None]
        if missing:
            raise PlacerError(f"--slurm: {', '.join(missing)} not found on PATH; run verify on "
                              "a host with the Slurm client commands (a login node)")
        self.env = dict(env if env is not None else os.environ)

    def _run(self, argv: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd,
                                  env=env or self.env, timeout=COMMAND_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise PlacerError(f"--slurm: `{' '.join(argv[:2])}` did not answer in "
                              f"{COMMAND_TIMEOUT_S:g} s; is slurmctld up?") from None

    def submit(self, argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[int | None, str]:
        """``sbatch --parsable ...``: (job id, "") or (None, sbatch's error)."""
        done = self._run(["sbatch", "--parsable", *argv], cwd=cwd, env={**self.env, **env})
        first = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not first.isdigit():
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            return None, said[-1] if said else f"sbatch exited {done.returncode}"
        return int(first), ""

    def states(self, job_ids: Sequence[int]) -> dict[int, JobEnd]:
        """Current state of each job: squeue, then scontrol, then sacct for the ones gone."""
        if not job_ids:
            return {}
        out: dict[int, JobEnd] = {}
        listing = self._run(["squeue", "-h", "-t", "all", "-j", ",".join(map(str, job_ids)),
                             "-o", "%i|%T|%r"])
        if listing.returncode == 0:
            for line in listing.stdout.splitlines():
                parts = line.strip().split("|")
                if len(parts) == 3 and parts[0].isdigit():
                    out[int(parts[0])] = JobEnd(parts[1], "", parts[2])
        for job_id in job_ids:
            known = out.get(job_id)
            if known is None or known.done:
                out[job_id] = self.ended(job_id) or known or JobEnd(
                    "UNKNOWN", "", "neither squeue, scontrol nor sacct knows the job")
        return out

    def ended(self, job_id: int) -> JobEnd | None:
        """Final state and exit code of a job: scontrol (recent jobs), else sacct."""
        shown = self._run(["scontrol", "show", "job", "-o", str(job_id)])
        if shown.returncode == 0 and shown.stdout.strip():
            fields = scontrol_fields(shown.stdout.strip())
            if "JobState" in fields:
                return JobEnd(fields["JobState"], fields.get("ExitCode", ""),
                              fields.get("Reason", ""))
        acct = self._run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o",
                          "State,ExitCode,Reason"]) if shutil.which(
                              "sacct", path=self.env.get("PATH")) else None
        if acct is not None and acct.returncode == 0 and acct.stdout.strip():
            state, _, rest = acct.stdout.strip().splitlines()[0].partition("|")
            code, _, reason = rest.partition("|")
            return JobEnd(state.split()[0], code, reason)
        return None

    def cancel(self, job_id: int) -> None:
        self._run(["scancel", str(job_id)])


@dataclass
class SlurmJob:
    """One candidate's job: where it runs from, what it runs, and how it went."""

    index: int
    launch_dir: Path
    state_path: Path
    log_path: Path
    argv: tuple[str, ...]
    job_id: int | None = None
    started: float | None = None
    submitted: float = 0.0
    end: JobEnd | None = None
    timed_out: bool = False
    submit_error: str = ""

    def record(self) -> None:
        self.state_path.write_text(json.dumps({"job_id": self.job_id}) + "\n")

    def recorded_id(self) -> int | None:
        try:
            value = json.loads(self.state_path.read_text()).get("job_id")
        except (OSError, json.JSONDecodeError, AttributeError):
            return None
        return value if isinstance(value, int) else None

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def telling_line(self) -> str:
        """The log line that says what went wrong: the job's last error, not srun's notes on
        cleaning up after it; else the last line."""
        lines = [ln for ln in self.log_lines() if ln.strip()]
        own = [ln for ln in lines if not ln.startswith(("srun:", "slurmstepd:"))]
        errors = [ln for ln in own if "Error" in ln or "error:" in ln]
        return (errors or own or lines or [""])[-1].strip()


RENDEZVOUS_PORTS_FROM = 20000
"""Lowest rendezvous port handed out; ports are taken below the kernel's ephemeral range, so
the outgoing connections of jobs already running (gloo/NCCL open many) cannot take a port
between its choice here and the job's listen on it (EADDRINUSE, seen in CI)."""
_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default ip_local_port_range starts here


def free_port() -> int:
    """A port free here and not handed out before by this process, below the ephemeral range,
    for a candidate's rendezvous (concurrent jobs on a shared node never collide)."""
    high = _ephemeral_low()
    span = max(1, high - RENDEZVOUS_PORTS_FROM)
    start = RENDEZVOUS_PORTS_FROM + (os.getpid() * 7919) % span
    for step in range(span):
        port = RENDEZVOUS_PORTS_FROM + (start - RENDEZVOUS_PORTS_FROM + step) % span
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # every low port is taken
        s.bind(("", 0))
        return int(s.getsockname()[1])


def sbatch_argv(job: SlurmJob, options: SlurmOptions, timeout_s: float) -> list[str]:
    """Options before ``job.sbatch`` (they override its #SBATCH lines), then its arguments."""
    minutes = math.ceil(timeout_s / 60.0) + 2
    argv = [f"--output={job.log_path}", f"--time={options.time_limit or minutes}",
            f"--job-name=placer-verify-c{job.index}"]
    if options.partition:
        argv.append(f"--partition={options.partition}")
    if options.account:
        argv.append(f"--account={options.account}")
    if options.exclusive:
        argv.append("--exclusive")
    return [*argv, *options.sbatch_args, "job.sbatch", *job.argv]


def job_env(backend: str) -> dict[str, str]:
    """What launch.sh reads: the worker (PLACER_SCRIPT is set per job), Python, backend, port."""
    env = {"PYTHON": os.environ.get("PYTHON", sys.executable),
           "MASTER_PORT": str(free_port())}
    if backend == "gloo":
        env["PLACER_BACKEND"] = "gloo"
    return env


def run_jobs(client: SlurmClient, jobs: Sequence[SlurmJob], script: Path, options: SlurmOptions,
             timeout_s: float, backend: str, on_end: Callable[[SlurmJob], None]) -> None:
    """Submit (or re-attach to) every job, poll until each has ended, ``on_end`` as each does.

    A job still queued or running from an earlier call (its id in ``slurm.json``) is waited for
    rather than submitted again; one that ended without results is submitted afresh.
    """
    pending: list[SlurmJob] = []
    recorded = {j.index: j.recorded_id() for j in jobs}
    alive = client.states([i for i in recorded.values() if i is not None])
    for job in jobs:
        old = recorded[job.index]
        if old is not None and old in alive and not alive[old].done \
                and alive[old].state != "UNKNOWN":
            job.job_id = old
        else:
            env = {**job_env(backend), "PLACER_SCRIPT": str(script)}
            job.job_id, job.submit_error = client.submit(
                sbatch_argv(job, options, timeout_s), job.launch_dir, env)
            if job.job_id is None:
                job.end = JobEnd("NOT_SUBMITTED", "", job.submit_error)
                on_end(job)
                continue
        job.submitted = time.monotonic()
        job.record()
        pending.append(job)
    while pending:
        time.sleep(options.poll_s)
        states = client.states([j.job_id for j in pending if j.job_id is not None])
        now = time.monotonic()
        for job in list(pending):
            assert job.job_id is not None
            state = states[job.job_id]
            if state.state in ("RUNNING", "COMPLETING") and job.started is None:
                job.started = now
            if not state.done and job.started is not None and now - job.started > timeout_s:
                client.cancel(job.job_id)
                job.timed_out = True
                job.end = JobEnd("CANCELLED", "", f"placer's limit of {timeout_s:g} s")
            elif state.done or state.state == "UNKNOWN":
                job.end = state
            else:
                continue
            pending.remove(job)
            on_end(job)
