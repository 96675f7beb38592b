"""An emulated multi-node cluster on one machine: network namespaces, a bridge, and tbf shaping.

Why: placement decisions only matter when links differ. On a single box, one network namespace
per "node" makes ranks in the same namespace talk over ``lo`` (fast, unshaped) while ranks in
different namespaces cross a veth link shaped with ``tc tbf`` (slow, rate-limited), which is enough
to check a cost model's ranking of layouts with real torch.distributed traffic.

Topology for N nodes (all interfaces are created directly inside namespaces made here; the root
namespace is never touched)::

    node ns i:  lo, <prefix>v<i> = 10.213.0.(i+1)/24  --veth--  <prefix>b<i> (in bridge ns)
    bridge ns:  lo, <prefix>br (bridge) with every <prefix>b<i> attached

With a rate, tbf shapes both directions of every node link (egress of both veth ends). tbf is a
rate limiter only: it adds no latency (netem is not available here) and its burst lets small
messages through unshaped when the link is idle.

Needs root, ``ip`` and ``tc``; see :meth:`EmulatedCluster.available`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from placer.errors import PlacerError

__all__ = ["EmulatedCluster", "EmulationError", "EmulateSpecError", "parse_emulate_spec"]

_MAX_IFNAME = 15  # IFNAMSIZ - 1 on Linux
_COUNTER = itertools.count()
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_SPEC_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class EmulationError(RuntimeError):
    """Setting up or using the emulated cluster failed (a command failed, or not permitted)."""


class EmulateSpecError(PlacerError, ValueError):
    """An ``--emulate`` value is not of the form ``NODESxGPUS``."""


def parse_emulate_spec(spec: str) -> tuple[int, int]:
    """Parse ``"2x4"`` (nodes x GPUs per node) into ``(2, 4)``; both must be positive."""
    match = _SPEC_RE.match(str(spec))
    if match is None:
        raise EmulateSpecError(
            f"--emulate: {spec!r} is not valid; expected the form NODESxGPUS, e.g. 2x4"
        )
    nodes, gpus = int(match.group(1)), int(match.group(2))
    if nodes < 1 or gpus < 1:
        raise EmulateSpecError(
            f"--emulate: {spec!r} is not valid; NODES and GPUS in NODESxGPUS must both be >= 1"
        )
    return nodes, gpus


def _proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks (field 22 of /proc/pid/stat); None if it is gone.

    Used to make sure a pid recorded earlier still names the same process before signalling it.
    Zombies count as gone: they hold no resources and cannot be killed any further.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; everything after the last ')' is fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _descendants(pid: int) -> list[tuple[int, int]]:
    """All live descendants of ``pid`` as ``(pid, start_time)``, found via /proc children files.

    torchrun starts each worker in its own session, so killing torchrun's process group does not
    reach the workers; they are found through the process tree instead.
    """
    found: list[tuple[int, int]] = []
    stack = [pid]
    seen = {pid}
    while stack:
        current = stack.pop()
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child in seen:
                    continue
                seen.add(child)
                start = _proc_start_time(child)
                if start is not None:
                    found.append((child, start))
                    stack.append(child)
    return found


def _signal_pid(pid: int, start: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` only if it is still the process recorded with ``start``."""
    if _proc_start_time(pid) != start:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _run_checked(argv: Sequence[str], timeout_s: float = 30.0) -> str:
    """Run a short admin command; raise EmulationError with its stderr if it fails."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmulationError(f"`{shlex.join(argv)}` could not run: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
        raise EmulationError(f"`{shlex.join(argv)}` failed: {detail}")
    return done.stdout


@functools.lru_cache(maxsize=1)
def _probe_available() -> tuple[bool, str]:
    if sys.platform != "linux":
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root (euid is not 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` (iproute2) is not on PATH"
    ns = f"plcchk{os.getpid() % 100000}"
    created = False
    try:
        _run_checked(["ip", "netns", "add", ns])
        created = True
        _run_checked(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run_checked(["ip", "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
        _run_checked(["ip", "-n", ns, "link", "add", "pbr", "type", "bridge"])
        _run_checked(["ip", "-n", ns, "link", "set", "pb", "master", "pbr"])
        _run_checked(
            ["tc", "-n", ns, "qdisc", "add", "dev", "pa", "root", "tbf",
             "rate", "1mbit", "burst", "32kb", "latency", "10ms"]
        )  # fmt: skip
    except EmulationError as exc:
        return False, f"network namespace emulation does not work here: {exc}"
    finally:
        if created:
            with contextlib.suppress(EmulationError):
                _run_checked(["ip", "netns", "del", ns])
    return True, "root, ip netns, veth, bridge and tc tbf work"


class EmulatedCluster:
    """``num_nodes`` network namespaces joined by a bridge, optionally rate-limited with tbf.

    Use as a context manager. Everything created (namespaces, processes started through
    :meth:`run_in_node`) is removed on exit, at interpreter exit, and on SIGINT/SIGTERM while
    the context is active; teardown is idempotent and also runs when setup fails halfway.
    """

    def __init__(
        self,
        num_nodes: int,
        inter_node_mbit: float | None,
        *,
        name_prefix: str | None = None,
        subnet: str = "10.213.0.0/24",
        burst_bytes: int | None = None,
        latency_ms: float = 20.0,
        kill_grace_s: float = 5.0,
    ) -> None:
        if int(num_nodes) != num_nodes or num_nodes < 1:
            raise ValueError(f"num_nodes: {num_nodes!r} is not valid; expected an integer >= 1")
        if inter_node_mbit is not None and not inter_node_mbit > 0:
            raise ValueError(
                f"inter_node_mbit: {inter_node_mbit!r} is not valid; expected a rate > 0 "
                "in Mbit/s, or None for an unshaped link"
            )
        network = ipaddress.ip_network(subnet, strict=False)
        if not isinstance(network, ipaddress.IPv4Network):
            raise ValueError(f"subnet: {subnet!r} is not valid; expected an IPv4 network")
        if network.num_addresses - 2 < num_nodes:
            raise ValueError(f"subnet: {subnet!r} has too few addresses for {num_nodes} nodes")
        if name_prefix is None:
            name_prefix = f"plc{os.getpid() % 10000}{next(_COUNTER) % 100}"
        longest = len(name_prefix) + max(2, 1 + len(str(num_nodes - 1)))
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", name_prefix) or longest > _MAX_IFNAME:
            raise ValueError(
                f"name_prefix: {name_prefix!r} is not valid; expected letters and digits, "
                f"starting with a letter, short enough that names stay <= {_MAX_IFNAME} chars"
            )
        self.num_nodes = int(num_nodes)
        self.inter_node_mbit = inter_node_mbit
        self.name_prefix = name_prefix
        self.latency_ms = float(latency_ms)
        self.kill_grace_s = float(kill_grace_s)
        if burst_bytes is None and inter_node_mbit is not None:
            # 5 ms worth of traffic, at least 128 KiB so one 64 KiB GSO segment always fits.
            burst_bytes = max(128 * 1024, int(inter_node_mbit * 1e6 / 8 * 0.005))
        self.burst_bytes = burst_bytes
        self._prefixlen = network.prefixlen
        self._addresses = [str(network.network_address + i + 1) for i in range(self.num_nodes)]
        self._node_ns = [f"{name_prefix}n{i}" for i in range(self.num_nodes)]
        self._bridge_ns = f"{name_prefix}br"
        self.commands: list[str] = []
        self._created_ns: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._prev_handlers: dict[int, Any] = {}
        self._lock = threading.RLock()
        self._started = False
        self._closed = False

    # ---------------------------------------------------------------- properties

    @property
    def node_addresses(self) -> list[str]:
        """IPv4 address of each node's link, node 0 first (node 0 is the torchrun master)."""
        return list(self._addresses)

    @property
    def node_namespaces(self) -> list[str]:
        """Network namespace name of each node."""
        return list(self._node_ns)

    @property
    def bridge_namespace(self) -> str:
        """Namespace holding the bridge that joins the nodes (its ports carry the shaping too)."""
        return self._bridge_ns

    def interface_name(self, i: int) -> str:
        """Node-side interface of node ``i`` (for GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)."""
        self._check_node(i)
        return f"{self.name_prefix}v{i}"

    def _bridge_port(self, i: int) -> str:
        return f"{self.name_prefix}b{i}"

    @staticmethod
    def available() -> tuple[bool, str]:
        """Whether the emulation can run here (root, ``ip netns``, veth, bridge, ``tc tbf``).

        Probes by building and deleting a throwaway namespace; the result is cached per process.
        """
        return _probe_available()

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> EmulatedCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Create the namespaces, links and shaping; tear down what exists if any step fails."""
        with self._lock:
            if self._started:
                raise EmulationError("this EmulatedCluster was already started; make a new one")
            self._started = True
            atexit.register(self.close)
            self._install_signal_handlers()
            try:
                self._setup()
            except BaseException:
                self.close()
                raise

    def _setup(self) -> None:
        existing = set(self._list_namespaces())
        clash = sorted(existing.intersection([*self._node_ns, self._bridge_ns]))
        if clash:
            raise EmulationError(
                f"network namespace(s) {', '.join(clash)} already exist; pass another name_prefix"
            )
        br = self._bridge_ns
        self._add_namespace(br)
        self._cmd("ip", "-n", br, "link", "set", "lo", "up")
        bridge = f"{self.name_prefix}br"
        self._cmd("ip", "-n", br, "link", "add", bridge, "type", "bridge")
        self._cmd("ip", "-n", br, "link", "set", bridge, "up")
        for i, ns in enumerate(self._node_ns):
            node_if, port = self.interface_name(i), self._bridge_port(i)
            self._add_namespace(ns)
            self._cmd("ip", "-n", ns, "link", "set", "lo", "up")
            # Both ends are created directly inside their namespaces.
            self._cmd(
                "ip", "link", "add", node_if, "netns", ns,
                "type", "veth", "peer", "name", port, "netns", br,
            )  # fmt: skip
            self._cmd("ip", "-n", br, "link", "set", port, "master", bridge)
            self._cmd("ip", "-n", br, "link", "set", port, "up")
            address = f"{self._addresses[i]}/{self._prefixlen}"
            self._cmd("ip", "-n", ns, "addr", "add", address, "dev", node_if)
            self._cmd("ip", "-n", ns, "link", "set", node_if, "up")
            if self.inter_node_mbit is not None:
                self._shape(ns, node_if)
                self._shape(br, port)

    def _shape(self, ns: str, dev: str) -> None:
        assert self.inter_node_mbit is not None and self.burst_bytes is not None
        rate_kbit = max(1, round(self.inter_node_mbit * 1000))
        self._cmd(
            "tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
            "rate", f"{rate_kbit}kbit", "burst", str(self.burst_bytes),
            "latency", f"{self.latency_ms:g}ms",
        )  # fmt: skip

    def _add_namespace(self, ns: str) -> None:
        self._cmd("ip", "netns", "add", ns)
        self._created_ns.append(ns)

    def _cmd(self, *argv: str) -> str:
        if self._closed:
            raise EmulationError("the emulated cluster was torn down during setup")
        self.commands.append(shlex.join(argv))
        return _run_checked(argv)

    @staticmethod
    def _list_namespaces() -> list[str]:
        out = _run_checked(["ip", "netns", "list"])
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def close(self) -> None:
        """Kill every tracked process tree, then delete the namespaces. Safe to call repeatedly."""
        blocked = False
        if threading.current_thread() is threading.main_thread():
            # A second Ctrl-C must not interrupt the teardown halfway.
            signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
            blocked = True
        try:
            with self._lock:
                self._closed = True
                self._kill(self._procs, self.kill_grace_s)
                while self._created_ns:
                    ns = self._created_ns[-1]
                    self._kill_namespace_pids(ns)
                    with contextlib.suppress(EmulationError):
                        _run_checked(["ip", "netns", "del", ns])
                    self._created_ns.pop()
                self._restore_signal_handlers()
                atexit.unregister(self.close)
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)

    @staticmethod
    def _kill_namespace_pids(ns: str) -> None:
        """SIGKILL anything still inside ``ns``: only this object ever starts processes there."""
        try:
            out = _run_checked(["ip", "netns", "pids", ns])
        except EmulationError:
            return
        for pid in map(int, out.split()):
            start = _proc_start_time(pid)
            if start is not None:
                _signal_pid(pid, start, signal.SIGKILL)

    # ---------------------------------------------------------------- signals

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal only works in the main thread; atexit still covers us.
        for sig in _SIGNALS:
            self._prev_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        while self._prev_handlers:
            sig, prev = self._prev_handlers.popitem()
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_handlers.get(signum)
        self.close()
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:  # SIG_DFL, or a handler installed outside Python: die the default way.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # ---------------------------------------------------------------- processes

    def _check_node(self, i: int) -> None:
        if not 0 <= i < self.num_nodes:
            raise IndexError(f"node index {i} is out of range for {self.num_nodes} nodes")

    def run_in_node(
        self,
        i: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside node ``i``'s namespace, in its own session (so it can be killed
        as a group), and track it for teardown."""
        self._check_node(i)
        with self._lock:
            if not self._started or self._closed:
                raise EmulationError("run_in_node needs a started, not yet closed, cluster")
            popen_kwargs["start_new_session"] = True
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self._node_ns[i], *argv],
                env=dict(env) if env is not None else None,
                **popen_kwargs,
            )
            self._procs.append(proc)
            return proc

    def launch_torchrun(
        self,
        script_argv: list[str],
        nproc_per_node: int | list[int],
        master_port: int,
        extra_env: dict[str, str] | None,
        log_dir: Path,
        *,
        cwd: Path | None = None,
    ) -> list[subprocess.Popen[Any]]:
        """One torchrun per node with static rendezvous, so node i gets GROUP_RANK i and hence
        global ranks in node order. Output of node i goes to ``log_dir/node<i>.log``."""
        counts = (
            [int(nproc_per_node)] * self.num_nodes
            if isinstance(nproc_per_node, int)
            else [int(n) for n in nproc_per_node]
        )
        if len(counts) != self.num_nodes or min(counts) < 1:
            raise ValueError(
                f"nproc_per_node: {nproc_per_node!r} is not valid; expected a positive int or "
                f"one positive int per node ({self.num_nodes})"
            )
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        procs: list[subprocess.Popen[Any]] = []
        for i in range(self.num_nodes):
            argv = [
                sys.executable, "-m", "torch.distributed.run",
                "--rdzv-backend", "static",
                "--node-rank", str(i),
                "--master-addr", self._addresses[0],
                "--master-port", str(master_port),
                "--local-addr", self._addresses[i],
                "--nnodes", str(self.num_nodes),
                "--nproc-per-node", str(counts[i]),
                "--max-restarts", "0",
                *script_argv,
            ]  # fmt: skip
            env = dict(os.environ)
            env.update(extra_env or {})
            env.update(
                GLOO_SOCKET_IFNAME=self.interface_name(i),
                PLACER_NODE_INDEX=str(i),
                OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
            )
            with open(log_dir / f"node{i}.log", "wb") as log:
                procs.append(
                    self.run_in_node(
                        i, argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd
                    )
                )
        return procs

    def wait(self, procs: Iterable[subprocess.Popen[Any]], timeout_s: float) -> list[int]:
        """Wait for ``procs`` up to ``timeout_s`` in total; on timeout kill their process trees.

        Returns the exit codes in order (negative: killed by that signal).
        """
        procs = list(procs)
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            remaining = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(remaining, 0.0))
            except subprocess.TimeoutExpired:
                break
        pending = [p for p in procs if p.poll() is None]
        if pending:
            self._kill(pending, self.kill_grace_s)
        return [int(p.returncode) if p.returncode is not None else -signal.SIGKILL for p in procs]

    @staticmethod
    def _kill(procs: Sequence[subprocess.Popen[Any]], grace_s: float) -> None:
        """SIGTERM each process group and every descendant, SIGKILL what is left after grace_s.

        Each tracked process leads its own session (pgid == pid). torchrun's workers live in
        sessions of their own, so descendants are collected from /proc as well.
        """
        live = [p for p in procs if p.poll() is None]
        tree: dict[int, int] = {}
        for proc in live:  # only unreaped pids are sure to still be ours
            tree.update(_descendants(proc.pid))
        if not live and not tree:
            return
        for proc in live:
            _signal_group(proc.pid, signal.SIGTERM)
        for pid, start in tree.items():
            _signal_pid(pid, start, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            for proc in live:
                tree.update(_descendants(proc.pid))
            live = [p for p in live if p.poll() is None]
            tree = {pid: s for pid, s in tree.items() if _proc_start_time(pid) == s}
            if not live and not tree:
                break
            time.sleep(0.05)
        for proc in live:
            tree.update(_descendants(proc.pid))
            _signal_group(proc.pid, signal.SIGKILL)
        for pid, start in tree.items():
            _signal_pid(pid, start, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
