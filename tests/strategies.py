"""Hypothesis strategies for (model, cluster, job) triples, and the oracle they are checked with.

The strategies reach the edge cases the robustness issue lists (1 GPU, prime GPU counts, 1 layer,
heads not divisible by 8, a 256k vocabulary, MoE with 1 expert, 1M-token sequences, 100,000-GPU
clusters, irregular nodes) while staying valid inputs: what the pydantic specs would reject is
covered by the malformed-file tests instead. ``run_case`` is the oracle shared by
tests/test_robust_fuzz.py and bench/fuzz.py: it runs the library in-process (solver, plan
building, launch files in memory, the ``placer check`` rules) and classifies the result as a
plan, an infeasibility reason, or a crash, checking every invariant of a plan on the way.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from hypothesis import strategies as st

from placer.errors import PlacerError
from placer.spec import Cluster, Job, Model
from placer.spec.base import MIN_BYTES_PER_S, MIN_EFFICIENCY, MIN_FLOPS
from placer.spec.presets import gpu_names
from placer.spec.profile import LinkProfile

T = TypeVar("T")
HUGE_CLUSTER_GPUS = 100_000
ONE_MILLION_TOKENS = 1 << 20
VOCAB_256K = 256 * 1024

# GPU shapes a cluster file may describe besides the presets: a small card and a big one.
_CUSTOM_GPUS = (
    {"name": "tiny-16GB", "memory_bytes": 16 * 2**30, "bf16_flops": 120e12,
     "hbm_bandwidth_bytes_per_s": 0.9e12},
    {"name": "huge-288GB", "memory_bytes": 288 * 10**9, "bf16_flops": 2.5e15,
     "fp8_flops": 5e15, "hbm_bandwidth_bytes_per_s": 8e12},
    # The spec's floors and ceilings: every time the cost model derives must stay finite.
    {"name": "floor", "memory_bytes": 2**30, "bf16_flops": MIN_FLOPS,
     "hbm_bandwidth_bytes_per_s": MIN_BYTES_PER_S},
    {"name": "ceiling", "memory_bytes": 10**14, "bf16_flops": 1e17, "fp8_flops": 1e17,
     "hbm_bandwidth_bytes_per_s": 1e15},
)
# Link rates from the spec's floor to far beyond any real link.
_BYTES_PER_S = (MIN_BYTES_PER_S, 16e9, 32e9, 64e9, 1e15)
_NVLINK_BYTES_PER_S = (MIN_BYTES_PER_S, 50e9, 300e9, 450e9, 900e9, 1e15)
_NIC_GBPS = (MIN_BYTES_PER_S * 8 / 1e9, 100, 200, 400, 10_000)

def _mostly(common: tuple[T, ...], rest: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """Usually a common value, one time in four anything in range (one_of picks evenly)."""
    usual = st.sampled_from(common)
    return st.one_of(usual, usual, usual, rest)


# ----- model ----------------------------------------------------------------------------------

_HEADS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 14, 16, 20, 24, 25, 28, 32, 40, 48, 56, 64, 96, 128)
_LAYERS = (1, 2, 3, 4, 5, 7, 8, 12, 16, 24, 30, 32, 36, 40, 48, 61, 80, 96, 126)
_VOCABS = (256, 1000, 32000, 50257, 51200, 128256, 151936, 201088, VOCAB_256K)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def moes(draw: st.DrawFn, num_layers: int, hidden: int) -> dict[str, Any]:
    """MoE settings, 1 expert included (a router that always picks the same expert)."""
    experts = draw(st.sampled_from((1, 2, 4, 8, 16, 60, 64, 128, 256)))
    top_k = draw(st.integers(1, min(experts, 8)))
    moe: dict[str, Any] = {
        "num_experts": experts,
        "top_k": top_k,
        "expert_ffn_hidden_size": draw(st.sampled_from((hidden // 4 or 1, hidden, 2 * hidden,
                                                        768, 1408))),
    }
    if draw(st.booleans()):
        moe["num_shared_experts"] = draw(st.integers(0, 2))
        moe["first_dense_layers"] = draw(st.integers(0, min(3, num_layers)))
        moe["layer_frequency"] = draw(st.sampled_from((1, 1, 2)))
    return moe


@st.composite
def models(draw: st.DrawFn) -> Model:
    """A decoder-only transformer, dense or MoE, from 1 layer to very large."""
    layers = draw(_mostly(_LAYERS, st.integers(1, 10_000)))
    heads = draw(st.sampled_from(_HEADS))
    head_dim = draw(st.sampled_from((32, 64, 80, 96, 128, 256)))
    explicit_head_dim = draw(st.booleans()) and heads > 1
    hidden = heads * head_dim
    if explicit_head_dim:  # hidden_size need not be heads x head_dim (Qwen3, GPT-OSS)
        hidden = draw(st.sampled_from((hidden, 2048, 2880, 4096, 5120)))
    kv = draw(st.sampled_from(_divisors(heads)))
    ffn = draw(st.sampled_from((hidden, 4 * hidden, (8 * hidden) // 3, 3 * hidden + 7)))
    data: dict[str, Any] = {
        "name": draw(st.sampled_from(("fuzz", "m.1", "model-x_2", "a+b"))),
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv,
        "ffn_hidden_size": ffn,
        "gated_mlp": draw(st.booleans()),
        "vocab_size": draw(st.sampled_from(_VOCABS)),
        "tied_embeddings": draw(st.booleans()),
        "max_seq_len": draw(st.none() | st.sampled_from((2048, 4096, 131072))),
    }
    if explicit_head_dim:
        data["head_dim"] = head_dim
    if draw(st.integers(0, 3)) == 0:
        data["moe"] = draw(moes(layers, hidden))
    return Model.model_validate(data)


# ----- cluster --------------------------------------------------------------------------------


def _chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


@st.composite
def fabrics(draw: st.DrawFn, gpus_per_node: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(("nvswitch", "nvswitch", "nvlink_bridge", "pcie")))
    fabric: dict[str, Any] = {"kind": kind, "pcie_bandwidth_bytes_per_s":
                              draw(_mostly(_BYTES_PER_S[1:4], st.sampled_from(_BYTES_PER_S)))}
    if kind != "pcie":
        fabric["nvlink_bandwidth_bytes_per_s"] = draw(
            _mostly(_NVLINK_BYTES_PER_S[1:5], st.sampled_from(_NVLINK_BYTES_PER_S)))
    if kind == "nvswitch":
        # The node itself, or a domain spanning trays (GB200 NVL72: 18 trays of 4).
        fabric["nvlink_domain_size"] = draw(st.sampled_from(
            (gpus_per_node, gpus_per_node, 2 * gpus_per_node, 18 * gpus_per_node)))
        fabric["nvls"] = draw(st.booleans())
    if kind == "nvlink_bridge":
        fabric["nvlink_groups"] = _chunks(gpus_per_node, draw(st.sampled_from((1, 2, 4))))
    if draw(st.booleans()):
        fabric["pcie_switch_groups"] = _chunks(gpus_per_node, draw(st.sampled_from((1, 2, 4))))
    if draw(st.booleans()):
        fabric["numa_groups"] = _chunks(gpus_per_node, max(1, gpus_per_node // 2))
    return fabric


@st.composite
def node_types(draw: st.DrawFn, name: str, gpus_per_node: int) -> dict[str, Any]:
    gpu = draw(st.sampled_from(gpu_names()) | st.sampled_from(_CUSTOM_GPUS))
    nic_share = draw(st.sampled_from((0, 1, 1, 2, 4, gpus_per_node)))
    rate = _mostly(_NIC_GBPS[1:4], st.sampled_from(_NIC_GBPS))
    nics = [{"name": f"mlx5_{i}", "rate_gbps": draw(rate), "gpus": chunk}
            for i, chunk in enumerate(_chunks(gpus_per_node, nic_share))] if nic_share else []
    return {"name": name, "gpu": gpu, "gpus_per_node": gpus_per_node,
            "fabric": draw(fabrics(gpus_per_node)), "nics": nics}


_GPUS_PER_NODE = (1, 2, 3, 4, 5, 7, 8, 8, 8, 16)


@st.composite
def clusters(draw: st.DrawFn, huge: bool | None = None, max_nodes: int = 64) -> Cluster:
    """A cluster of 1 GPU up to 100,000; one or two pools; failed GPUs; host names.

    ``huge``: True forces a 100,000-GPU cluster, False rules it out, None lets the draw decide
    (one time in 1,000: one can take minutes). ``max_nodes`` bounds the other clusters' node count.
    """
    if huge is None:  # sampled_from draws evenly; integers() favours its bounds
        huge = draw(st.sampled_from((False,) * 999 + (True,)))
    if huge:
        gpn = draw(st.sampled_from((4, 8)))
        pools = [(gpn, HUGE_CLUSTER_GPUS // gpn)]
    else:
        shape = draw(st.sampled_from(("one-gpu", "prime", "regular", "regular", "regular",
                                      "mixed")))
        if shape == "one-gpu":
            pools = [(1, 1)]
        elif shape == "prime":
            prime = draw(st.sampled_from((2, 3, 5, 7, 11, 13, 31, 61, 127)))
            pools = [draw(st.sampled_from(((1, prime), (prime, 1))))] if prime <= max_nodes \
                else [(prime, 1)]
        elif shape == "regular":
            pools = [(draw(st.sampled_from(_GPUS_PER_NODE)), draw(st.integers(1, max_nodes)))]
        else:
            pools = [(draw(st.sampled_from(_GPUS_PER_NODE)),
                      draw(st.integers(1, min(8, max_nodes)))) for _ in range(2)]
    types = [draw(node_types(f"type{i}", gpn)) for i, (gpn, _) in enumerate(pools)]
    hostnames = draw(st.booleans()) and not huge
    pool_data = []
    first_node = 0
    for i, (_, count) in enumerate(pools):
        pool: dict[str, Any] = {"node_type": f"type{i}", "count": count}
        if hostnames:
            pool["hostnames"] = [f"n{first_node + k:04d}.cluster.local" for k in range(count)]
        pool_data.append(pool)
        first_node += count
    total_nodes = first_node
    excluded: list[dict[str, int]] = []
    if draw(st.integers(0, 3)) == 0 and sum(g * c for g, c in pools) > 1:
        wanted = draw(st.integers(1, 3))
        for _ in range(wanted):
            node = draw(st.integers(0, total_nodes - 1))
            gpn = _gpus_on(pools, node)
            ref = {"node": node, "gpu": draw(st.integers(0, gpn - 1))}
            if ref not in excluded:
                excluded.append(ref)
        if len(excluded) >= sum(g * c for g, c in pools):
            excluded.pop()
    network = {"kind": draw(st.sampled_from(("infiniband", "infiniband", "roce", "ethernet"))),
               "rail_optimized": draw(st.booleans()),
               "nodes_per_leaf": draw(st.sampled_from((4, 18, 32))),
               "oversubscription": draw(st.sampled_from((1.0, 2.0)))}
    data: dict[str, Any] = {"name": "fuzz-cluster", "node_types": types, "pools": pool_data,
                            "excluded_gpus": excluded, "network": network}
    if draw(st.booleans()):
        data["socket_ifname"] = draw(st.sampled_from(("eth0", "^docker,lo", "=ib0")))
    return Cluster.model_validate(data)


def _gpus_on(pools: list[tuple[int, int]], node: int) -> int:
    for gpn, count in pools:
        if node < count:
            return gpn
        node -= count
    raise IndexError(node)


# ----- job ------------------------------------------------------------------------------------

_SEQ_LENS = (1, 7, 128, 1000, 2048, 4096, 8192, 32768, 131072, ONE_MILLION_TOKENS)
_BATCHES = (1, 2, 3, 7, 16, 64, 96, 256, 512, 1024, 2048, 4096)
_CONSTRAINTS = ("tp<=8", "pp in 1,2,4", "zero>=1", "recompute=full", "cp=1", "tp>=2", "dp!=1",
                "mbs<=2", "sp=on", "ep<=8", "pp=1")


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    data: dict[str, Any] = {
        "name": "fuzz-job",
        "seq_len": draw(_mostly(_SEQ_LENS, st.integers(1, 100_000_000))),
        "global_batch_size": draw(_mostly(_BATCHES, st.integers(1, 100_000_000))),
        "precision": draw(st.sampled_from(("bf16", "fp8"))),
        "memory_headroom": draw(st.sampled_from((0.0, 0.05, 0.2))),
        "allow_tp_outside_nvlink": draw(st.integers(0, 4)) == 0,
    }
    if draw(st.integers(0, 3)) == 0:
        data["constraints"] = draw(st.lists(st.sampled_from(_CONSTRAINTS), max_size=2,
                                            unique=True))
    return Job.model_validate(data)


def triples(huge: bool | None = None,
            max_nodes: int = 64) -> st.SearchStrategy[tuple[Model, Cluster, Job]]:
    return st.tuples(models(), clusters(huge, max_nodes), jobs())


@st.composite
def profiles(draw: st.DrawFn) -> LinkProfile:
    """A measured link profile (``--profile``), from the spec's floors to far beyond real links."""
    def link() -> dict[str, Any]:
        return {"latency_s": draw(st.sampled_from((0.0, 2e-6, 1e-4, 1.0))),
                "bandwidth_bytes_per_s": draw(st.sampled_from((MIN_BYTES_PER_S, 5e7, 4e10,
                                                               3e11, 1e14)))}
    data: dict[str, Any] = {"intra_node": link(), "inter_node": link()}
    if draw(st.booleans()):
        data["intra_node"]["collectives"] = {"all_reduce": link()}
    if draw(st.booleans()):
        data["gemm"] = {"max_efficiency": draw(st.sampled_from((MIN_EFFICIENCY, 0.3, 1.0))),
                        "half_efficiency_flops": draw(st.sampled_from((0.0, 1e9, 1e16)))}
    return LinkProfile.model_validate(data)


# ----- edge-case tags -------------------------------------------------------------------------


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def edge_tags(model: Model, cluster: Cluster, job: Job) -> list[str]:
    """Which of the issue's edge cases a triple exercises (for counts, not for the checks)."""
    gpus = cluster.num_gpus
    tags = {
        "1 GPU": gpus == 1,
        "prime GPU count": _is_prime(gpus),
        "1 layer": model.num_layers == 1,
        "heads not divisible by 8": model.num_attention_heads % 8 != 0,
        "256k vocabulary": model.vocab_size >= VOCAB_256K,
        "MoE with 1 expert": model.moe is not None and model.moe.num_experts == 1,
        "MoE": model.moe is not None,
        "1M-token sequence": job.seq_len >= ONE_MILLION_TOKENS,
        "100,000-GPU cluster": gpus >= HUGE_CLUSTER_GPUS - 3,
        "irregular nodes": not cluster.is_regular,
        "failed GPUs": bool(cluster.excluded_gpus),
    }
    return [name for name, hit in tags.items() if hit]


# ----- the oracle -----------------------------------------------------------------------------

Kind = Literal["plan", "infeasible", "crash"]


@dataclass
class Outcome:
    kind: Kind
    detail: str = ""
    candidates: int = 0
    plan_text: str = ""
    tags: list[str] = field(default_factory=list)


class InvariantError(AssertionError):
    """A plan came back but breaks one of its promises (counted as a crash)."""


def _one_line(message: str) -> bool:
    return bool(message.strip()) and "\n" not in message and "\r" not in message


def check_invariants(plan: Any, launch_candidates: int = 1) -> None:
    """Every promise a plan makes; raises InvariantError naming the first broken one.

    - the plan JSON validates as a ``Plan`` (``placer launch`` can read it back);
    - each candidate's layout passes ``layout_problem`` and fits its own memory estimate and
      the topology-free ``memory_estimate`` that ``placer check`` uses;
    - each rank map is a bijection between ranks 0..n-1 and distinct healthy GPUs (all of them
      on a regular cluster), its coordinates fill the grid, and every group of every dimension
      has exactly the layout's degree;
    - ``placer check`` finds no error in the plan; the launch files render.
    """
    from placer.check.parse_plan import parse_plan
    from placer.check.resolve import CheckOptions, check_config
    from placer.cost import memory_estimate
    from placer.dims import GROUPS as GROUP_DIMS
    from placer.launch import launch_files, placement_of
    from placer.report.plan import plan_data
    from placer.spec import Plan
    from placer.spec.layout import layout_problem

    data = plan_data(plan)
    try:
        Plan.model_validate(data)
    except Exception as exc:  # noqa: BLE001 - any failure is the finding
        raise InvariantError(f"plan JSON does not validate: {_first_line(exc)}") from None
    model, cluster, job = plan.model, plan.cluster, plan.job
    if not plan.candidates:
        raise InvariantError("a plan with no candidates")
    for index, cand in enumerate(plan.candidates):
        where = f"candidate {index} ({cand.layout.compact()})"
        layout = cand.layout
        problem = layout_problem(layout, model, job, layout.num_gpus)
        if problem is not None:
            raise InvariantError(f"{where}: layout_problem says {problem}")
        mem = cand.memory
        if not cand.fits or mem.total_bytes > mem.capacity_bytes \
                or cand.peak_memory_bytes > mem.capacity_bytes:
            raise InvariantError(f"{where}: does not fit its memory estimate "
                                 f"({mem.total_bytes} > {mem.capacity_bytes} bytes)")
        cheap = memory_estimate(model, cluster, job, layout)
        if cheap.total_bytes > cheap.capacity_bytes:
            raise InvariantError(f"{where}: memory_estimate says {cheap.total_bytes} bytes > "
                                 f"{cheap.capacity_bytes} usable")
        _check_rank_map(cand, cluster, where)
        if index < launch_candidates:
            placement = placement_of(plan, index)
            for dim in GROUP_DIMS:
                degree = _degree(layout, dim)
                groups = placement.groups[dim]
                sizes = {len(g) for g in groups}
                members = sorted(r for g in groups for r in g)
                if sizes != {degree} or members != list(range(layout.num_gpus)):
                    raise InvariantError(f"{where}: {dim} groups have sizes {sorted(sizes)}, "
                                         f"not a partition into groups of {degree}")
            launch_files(plan, index)
    summary, findings = check_config(parse_plan(Path("plan.json"), data), CheckOptions())
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise InvariantError(f"placer check rejects the plan: [{errors[0].rule_id}] "
                             f"{errors[0].message}")
    del summary


def _degree(layout: Any, dim: str) -> int:
    if dim == "dp_cp":
        return int(layout.dp * layout.cp)
    if dim == "edp":
        return int(layout.expert_dp)
    return int(getattr(layout, dim))


def _check_rank_map(cand: Any, cluster: Cluster, where: str) -> None:
    """Ranks <-> healthy GPUs one to one; coordinates fill the grid; groups match the degrees.

    Computed from the coordinates the plan writes, independently of placer.mesh's group code.
    """
    layout = cand.layout
    entries = cand.rank_map
    n = layout.num_gpus
    if sorted(e.rank for e in entries) != list(range(n)):
        raise InvariantError(f"{where}: ranks are not 0..{n - 1} once each")
    gpus = [(e.node, e.gpu) for e in entries]
    if len(set(gpus)) != n:
        raise InvariantError(f"{where}: two ranks share a GPU")
    for node, gpu in gpus:
        if not 0 <= node < cluster.num_nodes or gpu not in cluster.healthy_gpus(node):
            raise InvariantError(f"{where}: rank on node {node} GPU {gpu}, not a healthy GPU")
    idle = f"uses {n} of {cluster.num_gpus} GPUs because"
    if cluster.is_regular and n != cluster.num_gpus and not any(w.startswith(idle)
                                                                for w in cand.why):
        raise InvariantError(f"{where}: leaves GPUs of a regular cluster idle without saying "
                             "why")
    sizes = {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp, "pp": layout.pp}
    points = {tuple(e.coords.get(d, 0) for d in ("tp", "cp", "dp", "pp")) for e in entries}
    if len(points) != n or any(not 0 <= p[i] < s for p in points
                               for i, s in enumerate(sizes.values())):
        raise InvariantError(f"{where}: coordinates do not fill the {n}-point grid")
    dense = ("tp", "cp", "dp", "pp")
    for dim in dense:
        counts = Counter(tuple(e.coords.get(d, 0) for d in dense if d != dim) for e in entries)
        if set(counts.values()) != {sizes[dim]}:
            raise InvariantError(f"{where}: {dim} groups are not of size {sizes[dim]}")
    if layout.ep > 1:
        counts = Counter((e.coords["pp"], e.coords["etp"], e.coords["edp"]) for e in entries)
        if set(counts.values()) != {layout.ep}:
            raise InvariantError(f"{where}: ep groups are not of size {layout.ep}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def run_case(model: Model, cluster: Cluster, job: Job, *, top_k: int = 3,
             with_what_ifs: bool = False, launch_candidates: int = 1,
             profile: LinkProfile | None = None) -> Outcome:
    """Recommend as ``recommend-layout`` does, build and render the plan, check it.

    The result is a plan that keeps every promise, a one-line reason, or a crash. ``with_what_ifs``
    adds the what-if solver runs (three more searches, so callers use it on a share of cases).
    """
    from placer.report.plan import make_plan, plan_json
    from placer.report.tables import render_text

    tags = edge_tags(model, cluster, job) + (["link profile"] if profile else [])
    try:
        rec = make_plan(model, cluster, job, top_k=top_k, with_what_ifs=with_what_ifs,
                        profile=profile)
        render_text(rec)
        check_invariants(rec.plan, launch_candidates)
        return Outcome("plan", candidates=len(rec.plan.candidates),
                       plan_text=plan_json(rec.plan), tags=tags)
    except PlacerError as exc:
        message = str(exc)
        if not _one_line(message):
            return Outcome("crash", f"{type(exc).__name__} message is not one line: "
                           f"{message!r}", tags=tags)
        return Outcome("infeasible", message, tags=tags)
    except Exception as exc:  # noqa: BLE001 - a crash is what this oracle reports
        frames = traceback.extract_tb(exc.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames)
                      if "/placer/" in f.filename), "?")
        return Outcome("crash", f"{_first_line(exc)} at {where}", tags=tags)


def describe(model: Model, cluster: Cluster, job: Job) -> str:
    """A short reproduction line for a failing triple."""
    pools = ", ".join(f"{p.count}x{cluster.node_type_named(p.node_type).gpus_per_node}"
                      f"({cluster.node_type_named(p.node_type).fabric.kind})"
                      for p in cluster.pools)
    return (f"model={model.model_dump_json(exclude_defaults=True)} pools=[{pools}] "
            f"excluded={len(cluster.excluded_gpus)} job={job.model_dump_json()}")
