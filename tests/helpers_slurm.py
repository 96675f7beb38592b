"""A real one-node Slurm cluster for tests: Debian's slurm-wlm + munge, started and stopped here.

``start_slurm(root)`` writes its own ``slurm.conf`` / ``gres.conf`` / munge key under ``root``
(free ports, its own StateSaveLocation, spool, pid and log files), starts ``munged``,
``slurmctld`` and ``slurmd`` in the foreground as children of the test process and waits until
the node is idle. ``SlurmCluster.stop()`` cancels every job, waits for them to end and stops the
three daemons by PID. Clients reach it through ``SLURM_CONF`` (``cluster.env``), so the machine's
own Slurm configuration, if any, is never read or touched.

Fake GPUs: ``gres.conf`` lists ``gpus`` character devices made under ``root`` (harmless ones
stand in for /dev/nvidia*), so ``--gpus-per-node`` allocates and Slurm sets
``CUDA_VISIBLE_DEVICES`` the way it does on a GPU node. ``SlurmdParameters=config_overrides``
lets the node claim more CPUs than the machine has, so a few small jobs run side by side.

Use the ``slurm_cluster`` fixture (module scope; import it into the test module) or
``start_slurm`` directly. Both skip with the reason when not root or the packages are missing
(and fail instead when ``CI=true``: CI must run them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from placer.verify.slurm import TERMINAL_STATES, scontrol_fields

# Debian bookworm: slurm-wlm (slurmctld, slurmd, client commands) and munge.
PACKAGES = "slurm-wlm munge"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
START_TIMEOUT_S = 40.0
STOP_GRACE_S = 10.0


def available() -> tuple[bool, str]:
    """Whether a private Slurm can be started here, and why not."""
    if os.geteuid() != 0:
        return False, "needs root (slurmd runs jobs as the submitting user and must be root)"
    missing = [p for p in (*DAEMONS, *CLIENTS) if shutil.which(p) is None
               and not Path("/usr/sbin", p).exists()]
    if missing:
        return False, (f"missing {', '.join(missing)}; install with "
                       f"`apt-get install -y {PACKAGES}`")
    return True, ""


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    """A running private Slurm: one node named after this host, ``gpus`` fake GPUs."""

    root: Path
    node_name: str
    gpus: int
    cpus: int
    partition: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def run(self, *argv: str, check: bool = True, timeout_s: float = 30.0,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              check=check, timeout=timeout_s, cwd=cwd)

    def sbatch(self, script: Path, *args: str, options: tuple[str, ...] = (),
               cwd: Path | None = None) -> int:
        """Submit ``script`` (with ``options`` before it, ``args`` after); the job id."""
        done = self.run("sbatch", "--parsable", *options, str(script), *args,
                        cwd=cwd or script.parent)
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """The job's record from slurmctld (kept MinJobAge seconds after it ends)."""
        done = self.run("scontrol", "show", "job", "-o", str(job_id))
        return scontrol_fields(done.stdout.strip())

    def wait_job(self, job_id: int, timeout_s: float = 120.0) -> dict[str, str]:
        """Poll until the job reaches a terminal state; its record. Raises on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.job(job_id)
            if record.get("JobState") in TERMINAL_STATES:
                return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {record.get('JobState')} after "
                                   f"{timeout_s:g} s")
            time.sleep(0.5)

    def log_tail(self, lines: int = 20) -> str:
        """The end of every daemon log, for a failure message."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"== {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, wait for them to end, stop the daemons by PID. Idempotent."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.run("scancel", "--full", "--user", "root", check=False)
                deadline = time.monotonic() + STOP_GRACE_S * 2
                while time.monotonic() < deadline:
                    queue = self.run("squeue", "-h", "-o", "%i", check=False)
                    if queue.returncode != 0 or not queue.stdout.strip():
                        break
                    time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_GRACE_S)


# Harmless character devices (Linux devices.txt, major 1: null, zero, full, random, urandom) to
# stand in for GPUs: slurmd wants a device node per GPU to put into CUDA_VISIBLE_DEVICES.
FAKE_GPU_MINORS = (3, 5, 7, 8, 9)


def _fake_gpu_devices(folder: Path, gpus: int) -> list[Path]:
    """Character device nodes for ``gpus`` fake GPUs (empty when mknod is not allowed)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"fakegpu{i}" for i in range(gpus)]
    try:
        for path, minor in zip(paths, FAKE_GPU_MINORS, strict=False):
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, minor))
    except OSError:
        return []
    return paths if gpus <= len(FAKE_GPU_MINORS) else []


def _write_config(root: Path, node: str, gpus: int, cpus: int, partition: str) -> None:
    ctld_port, slurmd_port = _free_port(), _free_port()
    gpu_files = _fake_gpu_devices(root / "dev", gpus)
    conf = f"""\
ClusterName=placertest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
InactiveLimit=0
KillWait=5
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=30
Waittime=0
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4000 Gres=gpu:{gpus} State=UNKNOWN
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
    (root / "slurm.conf").write_text(conf)
    # Without device nodes the GPUs are only counted: they allocate, but Slurm then sets no
    # CUDA_VISIBLE_DEVICES (gres.conf(5), "File").
    gres = ("".join(f"Name=gpu File={path}\n" for path in gpu_files) if gpu_files
            else f"Name=gpu Count={gpus}\n")
    (root / "gres.conf").write_text(gres)


def start_slurm(root: Path, gpus: int = 4, cpus: int = 8, partition: str = "debug"
                ) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under ``root``; skips the test when not possible."""
    ok, why = available()
    if not ok:
        if os.environ.get("CI") == "true":  # CI must run these tests: a skip there is a silent pass
            pytest.fail(f"Slurm test cluster under CI=true: {why}")
        pytest.skip(f"Slurm test cluster: {why}")
    node = socket.gethostname().split(".")[0]
    root = root.absolute()
    for sub in ("state", "spool", "run", "log", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _write_config(root, node, gpus, cpus, partition)
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    for var in [v for v in env if v.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_"))]:
        if var != "SLURM_CONF":
            del env[var]
    cluster = SlurmCluster(root, node, gpus, cpus, partition, env)
    commands = {
        "munged": [_binary("munged"), "--foreground", "--force",
                   f"--socket={root}/munge/munge.sock", f"--key-file={key}",
                   f"--log-file={root}/log/munged.log", f"--pid-file={root}/run/munged.pid",
                   f"--seed-file={root}/munge/seed"],
        "slurmctld": [_binary("slurmctld"), "-D", "-i", "-f", str(cluster.conf)],
        "slurmd": [_binary("slurmd"), "-D", "-N", node, "-f", str(cluster.conf)],
    }
    try:
        for name in DAEMONS:
            with open(root / "log" / f"{name}.out", "wb") as out:
                cluster.procs[name] = subprocess.Popen(
                    commands[name], stdout=out, stderr=subprocess.STDOUT, env=env,
                    cwd=root, start_new_session=True)
            if name == "munged":
                _wait_for(lambda: (root / "munge" / "munge.sock").exists(), cluster, name)
        _wait_for(lambda: _node_state(cluster) == "idle", cluster, "slurmd")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _node_state(cluster: SlurmCluster) -> str:
    done = cluster.run("sinfo", "-h", "-n", cluster.node_name, "-o", "%T", check=False,
                       timeout_s=10.0)
    return done.stdout.strip() if done.returncode == 0 else ""


def _wait_for(ready: Callable[[], bool], cluster: SlurmCluster, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        dead = [n for n, p in cluster.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"not ready in {START_TIMEOUT_S:g} s"
            raise RuntimeError(f"Slurm test cluster: {what} {why}\n{cluster.log_tail()}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A private one-node Slurm (4 fake GPUs, 8 CPUs), stopped by PID after the module."""
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()
