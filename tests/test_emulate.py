"""The emulated multi-node cluster: real namespaces, a shaped link, torchrun across nodes, cleanup.

Cleanup is tested as hard as setup: a leaked namespace or process survives the test run and
breaks the next one, so every exit path (normal, exception, failed setup, SIGTERM) is covered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers_dist import (
    REPO_ROOT,
    assert_groups_match,
    permuted_4rank_map,
    prepare_job,
    process_alive,
    read_results,
)

from placer.verify.emulate import (
    EmulatedCluster,
    EmulateSpecError,
    EmulationError,
    parse_emulate_spec,
)

AVAILABLE, WHY = EmulatedCluster.available()
needs_netns = pytest.mark.skipif(not AVAILABLE, reason=WHY)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


# ------------------------------------------------------------------ no root needed


@pytest.mark.parametrize(
    ("spec", "expected"), [("2x4", (2, 4)), ("1X8", (1, 8)), (" 4x2 ", (4, 2))]
)
def test_parse_emulate_spec(spec: str, expected: tuple[int, int]) -> None:
    assert parse_emulate_spec(spec) == expected


@pytest.mark.parametrize("spec", ["2", "2x", "x4", "2*4", "2x4x1", "two x four", "0x4", ""])
def test_parse_emulate_spec_rejects(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_emulate_spec(spec)
    assert isinstance(info.value, EmulateSpecError)
    assert repr(spec) in str(info.value)
    assert "NODESxGPUS" in str(info.value)


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="name_prefix"):
        EmulatedCluster(2, None, name_prefix="averyveryverylongprefix")
    with pytest.raises(ValueError, match="inter_node_mbit"):
        EmulatedCluster(2, 0)
    with pytest.raises(ValueError, match="too few addresses"):
        EmulatedCluster(3, None, subnet="10.213.0.0/31")
    cluster = EmulatedCluster(3, 100.0)
    assert cluster.node_addresses == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
    assert len(set(cluster.node_namespaces)) == 3
    assert all(len(cluster.interface_name(i)) <= 15 for i in range(3))


# ------------------------------------------------------------------ needs root + netns

_SERVER = """
import socket, sys
addr, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr, port)); srv.listen(1); srv.settimeout(30)
conn, _ = srv.accept(); conn.settimeout(30)
got = 0
while got < total:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    got += len(chunk)
conn.sendall(b"k")
print(got)
"""

_CLIENT = """
import socket, sys, time, json
addr, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 10
while True:
    try:
        sock = socket.create_connection((addr, port), timeout=30)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
payload = b"x" * total
t0 = time.perf_counter()
sock.sendall(payload)
assert sock.recv(1) == b"k"
print(json.dumps({"bytes": total, "seconds": time.perf_counter() - t0}))
"""


@needs_netns
def test_shaped_link_rate_and_cleanup() -> None:
    before_int = signal.getsignal(signal.SIGINT)
    before_term = signal.getsignal(signal.SIGTERM)
    total = 8 * 1024 * 1024
    with EmulatedCluster(2, 400) as cluster:
        names = cluster.node_namespaces + [cluster.bridge_namespace]
        assert set(names) <= _namespaces()
        assert signal.getsignal(signal.SIGTERM) != before_term
        assert any("tbf rate 400000kbit" in c for c in cluster.commands)
        assert sum(" tbf " in c for c in cluster.commands) == 4  # both directions, both nodes
        server = cluster.run_in_node(
            1,
            [sys.executable, "-c", _SERVER, cluster.node_addresses[1], "5201", str(total)],
            stdout=subprocess.PIPE,
            text=True,
        )
        client = cluster.run_in_node(
            0,
            [sys.executable, "-c", _CLIENT, cluster.node_addresses[1], "5201", str(total)],
            stdout=subprocess.PIPE,
            text=True,
        )
        client_out, _ = client.communicate(timeout=30)
        server_out, _ = server.communicate(timeout=30)
        assert client.returncode == 0 and server.returncode == 0
        assert int(server_out) == total
        measured = json.loads(client_out)
        mbit = measured["bytes"] * 8 / measured["seconds"] / 1e6
        assert 300 <= mbit <= 500, f"measured {mbit:.0f} Mbit/s over the 400 Mbit/s link"
    assert not set(names) & _namespaces()
    assert signal.getsignal(signal.SIGINT) is before_int
    assert signal.getsignal(signal.SIGTERM) is before_term
    cluster.close()  # idempotent


@needs_netns
def test_exception_in_block_kills_process_trees_and_removes_namespaces() -> None:
    # The child starts a grandchild in its own session, as torchrun does with its workers.
    spawner = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    with pytest.raises(RuntimeError, match="boom"), EmulatedCluster(2, None) as cluster:
        names = cluster.node_namespaces + [cluster.bridge_namespace]
        proc = cluster.run_in_node(
            0, [sys.executable, "-c", spawner], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        assert process_alive(grandchild)
        t0 = time.monotonic()
        codes = cluster.wait([proc], timeout_s=0.5)
        assert codes == [-signal.SIGTERM] and time.monotonic() - t0 < 5
        assert not process_alive(grandchild)
        straggler = cluster.run_in_node(1, ["sleep", "300"])
        raise RuntimeError("boom")
    assert straggler.returncode is not None
    assert not set(names) & _namespaces()


@needs_netns
def test_failed_setup_is_torn_down(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def failing_shape(self: EmulatedCluster, ns: str, dev: str) -> None:
        calls.append(ns)
        if len(calls) == 3:
            raise EmulationError("injected failure")

    monkeypatch.setattr(EmulatedCluster, "_shape", failing_shape)
    before_term = signal.getsignal(signal.SIGTERM)
    cluster = EmulatedCluster(3, 100)
    with pytest.raises(EmulationError, match="injected"):
        cluster.__enter__()
    assert len(calls) == 3
    assert not (set(cluster.node_namespaces) | {cluster.bridge_namespace}) & _namespaces()
    assert signal.getsignal(signal.SIGTERM) is before_term


@needs_netns
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_tears_down(signum: int) -> None:
    prefix = f"plct{os.getpid() % 10000}"
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        # Python's own SIGINT handler even when started from a background job (which ignores
        # SIGINT): the test is about a process that a Ctrl-C would stop.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from placer.verify.emulate import EmulatedCluster
        with EmulatedCluster(2, 50, name_prefix={prefix!r}) as cluster:
            proc = cluster.run_in_node(1, ["sleep", "300"])
            print(proc.pid, flush=True)
            time.sleep(300)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    owner = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert owner.stdout is not None
        sleeper = int(owner.stdout.readline())
        assert f"{prefix}n1" in _namespaces()
        owner.send_signal(signum)
        # SIGTERM: default action re-raised; SIGINT: KeyboardInterrupt, which exits by SIGINT.
        assert owner.wait(timeout=30) == -signum
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    assert not process_alive(sleeper)
    assert not {f"{prefix}n0", f"{prefix}n1", f"{prefix}br"} & _namespaces()


@needs_netns
def test_torchrun_2x2_across_emulated_nodes(tmp_path: Path) -> None:
    # tp groups {0,3},{1,2} cross the shaped link; dp groups {0,1},{2,3} stay inside a node.
    rankmap = permuted_4rank_map([2, 2])
    script, out_dir = prepare_job(tmp_path / "job", rankmap)
    with EmulatedCluster(2, 400) as cluster:
        procs = cluster.launch_torchrun(
            [str(script), str(out_dir)],
            nproc_per_node=2,
            master_port=29533,
            extra_env={"PLACER_RANKMAP": str(script.with_name("rankmap.json"))},
            log_dir=tmp_path / "logs",
        )
        codes = cluster.wait(procs, timeout_s=150)
        logs = "\n".join(p.read_text() for p in sorted((tmp_path / "logs").glob("node*.log")))
        assert codes == [0, 0], logs
    results = read_results(out_dir, 4)
    assert_groups_match(rankmap, results)
    own_netns = os.readlink("/proc/self/ns/net")
    for res in results:
        node = rankmap["ranks"][res["rank"]]["node"]
        assert res["env"]["PLACER_NODE_INDEX"] == str(node)
        assert res["env"]["GROUP_RANK"] == str(node)
        assert res["env"]["GLOO_SOCKET_IFNAME"] == cluster.interface_name(node)
        assert res["env"]["MASTER_ADDR"] == cluster.node_addresses[0]
        assert res["netns"] != own_netns
    assert results[0]["netns"] == results[1]["netns"] != results[2]["netns"] == results[3]["netns"]
    assert results[0]["gathered"]["tp"] == [0, 3]
