"""Search speed: wall time and peak memory of ``recommend`` at scale, checked by brute force.

Five problems (issue targets in brackets): GPT-3 175B on 1,024 A100 [< 2 s], Llama 3 405B on
16,384 H100 [< 10 s], DeepSeek-V3 on 2,048 H100 [< 10 s], Llama 3 405B on 100,000 H100
[< 60 s, < 2 GiB], Llama 3 70B on 64 DGX H100 nodes with 5 failed GPUs [< 30 s]. Each runs in a
fresh process, so the peak resident memory (ru_maxrss, imports included) is that problem's own.

Brute force: every layout of the same space costed with the same cost model (natural mesh
order), reduced by the same rules as the table (least recompute that fits per knob setting, no
layout slower *and* larger than another of the same degrees), then the greedy top K. The search
(branch and bound, then the selection) must return the same K layouts; the bench prints both.

``--commands`` times ``placer recommend-layout`` itself as a user runs it (a fresh process,
default flags, what-ifs on) for the issue #20 problems [GPT-3 175B / 1,024 A100 < 2 s;
Llama 3.1 405B / 16,384 H100 < 4 s; DeepSeek-V3 from its HF config / 2,048 H100 < 6 s; 100,000
H100 with a batch of 16,000 < 20 s and < 2 GiB], beside the same inputs timed in a warm process,
with the ratios; it prints the machine's load before and after (timings on a shared machine).

``--published`` runs recommend-layout's search on every loadable production run of
bench/data/published-runs.json (bench/accuracy.py reads them) and compares the top
candidate's predicted step time with the published layout's, both priced by placer's cost model.

    .venv/bin/python bench/search_speed.py [--case NAME ...] [--no-brute] [--published]
    .venv/bin/python bench/search_speed.py --commands [--command NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placer.cost import estimate
from placer.errors import PlacerError
from placer.mesh import MeshGrid
from placer.solver import recommend
from placer.solver.search import search_space
from placer.solver.select import greedy_top, select_top
from placer.solver.space import knob_options
from placer.solver.table import build_table, exhaustive_rows, least_recompute, pareto_rows
from placer.spec import Cluster, Job, Model
from placer.spec.presets import cluster_preset, model_preset

IMPORT_CPU_S = time.process_time()
"""CPU time of this process before the search: interpreter start and imports (placer, ortools)."""
HERE = Path(__file__).resolve()
TOP_K = 5
BRUTE_LIMIT = 500_000
"""Layouts above which brute force is skipped (most are pruned by memory before costing; the
largest problems here, ~400k layouts, take a few minutes)."""


@dataclass(frozen=True)
class Problem:
    label: str
    build: Callable[[], tuple[Model, Cluster, Job]]
    target_s: float
    target_gib: float | None = None


def _degraded_64() -> Cluster:
    data = cluster_preset("dgx-h100").with_nodes(64).model_dump()
    failed = ((3, 2), (10, 7), (20, 0), (33, 5), (50, 3))
    data["excluded_gpus"] = [{"node": n, "gpu": g} for n, g in failed]
    return Cluster.model_validate(data)


PROBLEMS = {
    "gpt3": Problem(
        "GPT-3 175B, 1,024 A100 (DGX A100 x 128), seq 2048, batch 1536",
        lambda: (model_preset("gpt3-175b"), cluster_preset("dgx-a100").with_nodes(128),
                 Job(seq_len=2048, global_batch_size=1536)), 2.0),
    "llama405b": Problem(
        "Llama 3 405B, 16,384 H100 (DGX H100 x 2048), seq 8192, batch 2048 (16M tokens)",
        lambda: (model_preset("llama3-405b"), cluster_preset("dgx-h100").with_nodes(2048),
                 Job(seq_len=8192, global_batch_size=2048)), 10.0),
    "deepseek": Problem(
        "DeepSeek-V3 (671B MoE, 256 experts), 2,048 H100 (DGX H100 x 256), seq 4096, batch 4096",
        lambda: (model_preset("deepseek-v3"), cluster_preset("dgx-h100").with_nodes(256),
                 Job(seq_len=4096, global_batch_size=4096)), 10.0),
    "100k": Problem(
        "Llama 3 405B, 100,000 H100 (DGX H100 x 12,500), seq 8192, batch 12500",
        lambda: (model_preset("llama3-405b"), cluster_preset("dgx-h100").with_nodes(12_500),
                 Job(seq_len=8192, global_batch_size=12_500)), 60.0, 2.0),
    "irregular": Problem(
        "Llama 3 70B, 64 DGX H100 nodes with 5 failed GPUs (507 healthy), seq 4096, batch 960",
        lambda: (model_preset("llama3-70b"), _degraded_64(),
                 Job(seq_len=4096, global_batch_size=960)), 30.0),
}


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _tp_in_node(candidate: Any) -> bool:
    grid = MeshGrid(candidate.layout, tuple(candidate.mesh_order))
    node_of = {grid.logical_index(e.coords): e.node for e in candidate.rank_map}
    return all(len({node_of[i] for i in g}) == 1 for g in grid.groups("tp"))


def child_search(name: str) -> dict[str, Any]:
    model, cluster, job = PROBLEMS[name].build()
    started = time.perf_counter()
    result = recommend(model, cluster, job, top_k=TOP_K)
    wall_s = time.perf_counter() - started
    d = result.detail
    best = result.candidates[0]
    return {
        "wall_s": wall_s, "import_s": IMPORT_CPU_S, "peak_mib": _peak_mib(),
        "gpus": cluster.num_gpus,
        "gpus_used": d.gpus_used, "degree_tuples": d.degree_tuples, "layouts": d.layouts,
        "memory_checks": d.memory_checks, "estimates": d.estimates, "table_rows": d.table_rows,
        "status": d.selection_status, "bound_violations": d.bound_violations,
        "placements": d.placements_costed, "best": best.layout.compact(),
        "order": "-".join(best.mesh_order), "step_s": best.step_time_s, "mfu": best.mfu,
        "tp_in_node": all(_tp_in_node(c) for c in result.candidates),
        "why": best.why, "rank_map_entries": sum(len(c.rank_map) for c in result.candidates),
    }


def child_brute(name: str) -> dict[str, Any]:
    model, cluster, job = PROBLEMS[name].build()
    space = search_space(model, cluster, job)
    started = time.perf_counter()
    rows, stats = build_table(model, cluster, job, space.degrees, keep=TOP_K)
    picks = select_top(rows, job, [r.layout.num_gpus for r in rows], k=TOP_K, max_tp=None)
    search_s = time.perf_counter() - started
    layouts = sum(knob_options(d, model, job).count() for d in space.degrees)
    if layouts > BRUTE_LIMIT:
        return {"skipped": f"{layouts} layouts > {BRUTE_LIMIT}"}
    started = time.perf_counter()
    brute, costed = exhaustive_rows(model, cluster, job, space.degrees)
    reference = pareto_rows(least_recompute(brute))
    expected = [reference[i] for i in greedy_top(reference, TOP_K)]
    brute_s = time.perf_counter() - started
    got = [rows[i] for i in picks.picks]
    return {
        "search_s": search_s, "search_estimates": stats.estimates, "brute_s": brute_s,
        "brute_costed": costed, "brute_fit": len(brute),
        "search_top": [(r.layout.compact(), r.step_time_s) for r in got],
        "brute_top": [(r.layout.compact(), r.step_time_s) for r in expected],
        "same_top1": bool(got and expected and got[0].layout == expected[0].layout),
        "same_topk": [r.layout for r in got] == [r.layout for r in expected],
    }


def _spawn(mode: str, name: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(HERE), "--child", mode, name],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def run_speed(names: list[str], brute: bool) -> None:
    print(f"wall s = recommend(top_k={TOP_K}) from inputs to ranked candidates with rank maps, "
          "one fresh process per problem;\npeak = that process's ru_maxrss (imports included)\n")
    header = (f"{'problem':<10} {'GPUs':>7} {'wall s':>8} {'target':>7} {'peak MiB':>9} "
              f"{'tuples':>6} {'layouts':>8} {'costed':>7} {'rows':>5} {'status':>8}  best")
    print(header)
    print("-" * len(header))
    results = {}
    for name in names:
        problem = PROBLEMS[name]
        r = _spawn("search", name)
        results[name] = r
        if "error" in r:
            print(f"{name:<10} error: {r['error']}")
            continue
        target = f"<{problem.target_s:g}"
        ok = r["wall_s"] < problem.target_s
        if problem.target_gib is not None:
            ok = ok and r["peak_mib"] < problem.target_gib * 1024
            target += f",<{problem.target_gib:g}G"
        print(f"{name:<10} {r['gpus_used']:>7} {r['wall_s']:>8.2f} {target:>7} "
              f"{r['peak_mib']:>9.0f} {r['degree_tuples']:>6} {r['layouts']:>8} "
              f"{r['estimates']:>7} {r['table_rows']:>5} {r['status']:>8}  "
              f"{r['best']} {r['order']} {r['step_s']:.3f} s MFU {r['mfu']:.1%} "
              f"[{_mark(ok)}]")
    print()
    for name in names:
        r = results[name]
        if "error" not in r:
            print(f"{name}: {PROBLEMS[name].label}")
            print(f"  imports {r['import_s']:.1f} s CPU before the search (not in wall s); "
                  f"{r['gpus_used']} of {r['gpus']} GPUs used; TP inside a node in every "
                  f"candidate: {r['tp_in_node']}; bound violations: {r['bound_violations']}; "
                  f"{r['memory_checks']} memory checks; {r['placements']} placements costed; "
                  f"{r['rank_map_entries']} rank-map entries")
            for line in r["why"]:
                print(f"  {line}")
    if not brute:
        return
    print("\nbrute force (every layout of the space costed) vs the search, natural mesh order\n")
    for name in names:
        r = _spawn("brute", name)
        if "error" in r or "skipped" in r:
            print(f"{name}: brute force {r.get('skipped') or r.get('error')}")
            continue
        print(f"{name}: search {r['search_s']:.2f} s ({r['search_estimates']} estimates), "
              f"brute force {r['brute_s']:.1f} s ({r['brute_costed']} layouts costed, "
              f"{r['brute_fit']} fit); same optimum: {r['same_top1']}; same top {TOP_K}: "
              f"{r['same_topk']}")
        for (a, ta), (b, tb) in zip(r["search_top"], r["brute_top"], strict=False):
            flag = "=" if a == b else "!="
            print(f"  {ta:9.4f} {a:<70} {flag} {tb:9.4f} {b}")


@dataclass(frozen=True)
class Command:
    """A problem as a user types it: recommend-layout's flags, defaults for everything else."""

    label: str
    argv: tuple[str, ...]
    target_s: float
    target_gib: float | None = None


COMMANDS = {
    "gpt3": Command("GPT-3 175B, 1,024 A100 (DGX A100 x 128)",
                    ("--model", "gpt3-175b", "--cluster", "dgx-a100", "--nodes", "128"), 2.0),
    "llama405b": Command("Llama 3.1 405B, 16,384 H100 (DGX H100 x 2048)",
                         ("--model", "llama3-405b", "--cluster", "dgx-h100", "--nodes", "2048"),
                         4.0),
    "deepseek": Command("DeepSeek-V3 from its HF config, 2,048 H100 (DGX H100 x 256)",
                        ("--model", "tests/data/hf/deepseek-v3", "--cluster", "dgx-h100",
                         "--nodes", "256"), 6.0),
    "100k": Command("Llama 3.1 405B, 100,000 H100, batch 16,000 (no multiple of the GPUs)",
                    ("--model", "llama3-405b", "--cluster", "dgx-h100", "--nodes", "12500",
                     "--global-batch", "16000"), 20.0, 2.0),
}
"""The issue #20 targets: the whole command, a fresh process, default flags (what-ifs on)."""


def child_inproc(name: str) -> dict[str, Any]:
    """The command's inputs resolved as the command does, then timed inside this process: the
    main search alone (``recommend``) and the whole recommendation (``plan_in_steps`` with the
    what-ifs solved), both without rank maps, as the command's text output runs them."""
    from placer.cli.recommend_command import args_from_argv
    from placer.report.plan import plan_in_steps, with_what_ifs_solved

    args = args_from_argv(["--quiet", *COMMANDS[name].argv])
    from placer.cli.options import load_job_inputs

    inputs = load_job_inputs(args.model, args.cluster, nodes=args.nodes,
                             global_batch=args.global_batch, seq_len=args.seq_len,
                             precision=args.precision, constraints=args.constraints,
                             knobs=args.knobs)
    started = time.perf_counter()
    result = recommend(inputs.model, inputs.cluster, inputs.job, top_k=TOP_K, rank_maps=False)
    search_s = time.perf_counter() - started
    started = time.perf_counter()
    head, variants = plan_in_steps(inputs.model, inputs.cluster, inputs.job, top_k=TOP_K,
                                   rank_maps=False)
    rec = with_what_ifs_solved(head, list(variants))
    plan_s = time.perf_counter() - started
    return {"search_s": search_s, "plan_s": plan_s, "best": result.candidates[0].layout.compact(),
            "plan_best": rec.plan.candidates[0].layout.compact(), "what_ifs": len(rec.what_ifs),
            "gpus": inputs.cluster.num_gpus}


def time_command(argv: list[str]) -> dict[str, Any]:
    """Run ``placer recommend-layout ARGV`` in a fresh process: wall time, when the first line
    of the answer appeared on stdout, the child's CPU time (user + system: what the command
    costs, less sensitive than wall time to other work on a shared machine) and peak resident
    memory."""
    placer = Path(sys.executable).with_name("placer")
    started = time.perf_counter()
    first_s = None
    with subprocess.Popen([str(placer), "recommend-layout", *argv], cwd=HERE.parent.parent,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=command_env()) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for _line in proc.stdout:
            if first_s is None:
                first_s = time.perf_counter() - started
        err = proc.stderr.read()
        code = proc.wait()
    wall_s = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        return {"error": (err.strip().splitlines() or ["?"])[-1]}
    return {"wall_s": wall_s, "first_s": first_s, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_mib": usage.ru_maxrss / 1024}


def command_env() -> dict[str, str]:
    """The environment a user's command runs in: Python caches bytecode (as .ci/run lets it,
    unsetting PYTHONDONTWRITEBYTECODE), so a command does not compile placer's sources again."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def compile_sources() -> None:
    """Write placer's bytecode once before timing, as a user's first run leaves it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(HERE.parent.parent / "placer")],
                   env=command_env(), check=True, capture_output=True)


def _spawn_command(argv: list[str]) -> dict[str, Any]:
    """``time_command`` from a fresh helper process, so each peak memory is that run's own."""
    out = subprocess.run([sys.executable, str(HERE), "--time-command", json.dumps(argv)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} CPUs"


def run_commands(names: list[str]) -> None:
    """The command as a user runs it, beside the same work timed in a warm process."""
    print("command = placer recommend-layout FLAGS, fresh process, default flags (what-ifs on,")
    print("  in forked children where there are 2 CPUs; bytecode cached, as .ci/run and a user's")
    print("  second run have it); answer = when the first line of the answer reached stdout;")
    print("  cpu = user + system CPU of the command and its children; peak = the largest ru_maxrss")
    print("  of them (each process's own)")
    print("in-process = the same inputs in one warm process, without rank maps as the text output")
    print("  runs: the main search (recommend) and the whole recommendation (what-ifs included)")
    compile_sources()
    print(f"before: {_load()}")
    print()
    header = (f"{'problem':<10} {'GPUs':>7} {'command s':>9} {'answer s':>8} {'cpu s':>6} "
              f"{'target':>10} "
              f"{'peak MiB':>8} {'search s':>8} {'plan s':>7} {'cmd/plan':>8} "
              f"{'cmd/search':>10}  flags")
    print(header)
    print("-" * len(header))
    for name in names:
        command = COMMANDS[name]
        timed = _spawn_command(list(command.argv))
        inproc = _spawn("inproc", name)
        if "error" in timed or "error" in inproc:
            print(f"{name:<10} error: {timed.get('error') or inproc.get('error')}")
            continue
        ok = timed["wall_s"] < command.target_s
        target = f"<{command.target_s:g} s"
        if command.target_gib is not None:
            ok = ok and timed["peak_mib"] < command.target_gib * 1024
            target += f",<{command.target_gib:g}G"
        print(f"{name:<10} {inproc['gpus']:>7} {timed['wall_s']:>9.2f} {timed['first_s']:>8.2f} "
              f"{timed['cpu_s']:>6.2f} {target:>10} {timed['peak_mib']:>8.0f} "
              f"{inproc['search_s']:>8.2f} "
              f"{inproc['plan_s']:>7.2f} {timed['wall_s'] / inproc['plan_s']:>8.2f} "
              f"{timed['wall_s'] / inproc['search_s']:>10.2f}  {' '.join(command.argv)} "
              f"[{_mark(ok)}]")
    print()
    print(f"after: {_load()}")


def _accuracy_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_accuracy", HERE.with_name("accuracy.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_accuracy"] = module
    spec.loader.exec_module(module)
    return module


TORCHTITAN_SEQ_LEN = 8192
"""torchtitan's Llama 3 training configs use seq_len 8192 (its llama3 *.toml files); the
records of its tables do not state it, so bench/accuracy.py skips them."""


def _published_cases(accuracy: Any) -> tuple[list[Any], list[tuple[str, str]]]:
    """bench/accuracy.py's cases, plus the torchtitan runs at torchtitan's own sequence length."""
    cases, skipped, _ = accuracy.load()
    records = {r["id"]: r for r in json.loads(accuracy.RUNS.read_text())["records"]}
    still: list[tuple[str, str]] = []
    for record_id, why in skipped:
        if record_id.startswith("torchtitan") and "sequence length" in why:
            record = json.loads(json.dumps(records[record_id]))
            record["model"]["seq_length"] = TORCHTITAN_SEQ_LEN
            try:
                case = accuracy.case_for(record)
            except accuracy.Skip as again:
                still.append((record_id, str(again)))
                continue
            case.assumptions.append(f"seq_len {TORCHTITAN_SEQ_LEN} (torchtitan default)")
            cases.append(case)
        else:
            still.append((record_id, why))
    return cases, still


def run_published() -> None:
    """Top candidate vs the published layout, both priced by placer's cost model."""
    cases, skipped = _published_cases(_accuracy_module())
    print("published layout vs recommend's top candidate (default framework options for both;\n"
          "a ratio <= 1 means the top candidate is predicted at least as fast)\n")
    header = (f"{'record':<44} {'GPUs':>5} {'published layout':<34} {'pub s':>8} "
              f"{'top s':>8} {'ratio':>6}  TP-node  top layout")
    print(header)
    print("-" * len(header))
    wins: list[str] = []
    losses: list[str] = []
    oom: list[str] = []
    none: list[str] = []
    for case in cases:
        if case.oom:
            continue
        published = estimate(case.model, case.cluster, case.job, case.layout)
        try:
            top = recommend(case.model, case.cluster, case.job, top_k=1).candidates[0]
        except PlacerError as exc:
            print(f"{case.record_id[:44]:<44} no candidate: {exc}")
            none.append(case.record_id)
            continue
        ratio = top.step_time_s / published.step_time_s
        in_node = _tp_in_node(top)
        if not published.fits:
            oom.append(case.record_id)
        elif ratio <= 1.0 + 1e-9 and in_node:
            wins.append(case.record_id)
        else:
            losses.append(case.record_id)
        fits = "" if published.fits else " (OOM)"
        layout = (f"tp{case.layout.tp} pp{case.layout.pp} dp{case.layout.dp} cp{case.layout.cp}"
                  f" ep{case.layout.ep} mbs{case.layout.micro_batch_size}{fits}")
        idle = case.layout.num_gpus - top.layout.num_gpus
        used = f"[{top.layout.num_gpus} GPUs] " if idle else ""
        print(f"{case.record_id[:44]:<44} {case.layout.num_gpus:>5} {layout:<34} "
              f"{published.step_time_s:>8.3f} {top.step_time_s:>8.3f} {ratio:>6.3f}  "
              f"{str(in_node):<7}  {used}{top.layout.compact()}")
    judged = len(wins) + len(losses)
    print(f"\ntop candidate at least as fast as the published layout, TP inside a node: "
          f"{len(wins)} of {judged} runs whose published layout fits the memory model")
    print(f"slower: {', '.join(losses) or 'none'}")
    print(f"published layout predicted out of memory (not judged): {', '.join(oom) or 'none'}")
    print(f"no candidate (placer's degree rules reject every layout): {', '.join(none) or 'none'}")
    print(f"records skipped for lack of detail: {len(skipped)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", action="append", choices=sorted(PROBLEMS))
    parser.add_argument("--no-brute", action="store_true")
    parser.add_argument("--published", action="store_true")
    parser.add_argument("--commands", action="store_true",
                        help="time the command itself (fresh process, default flags) beside the "
                             "in-process figures, for the issue #20 problems")
    parser.add_argument("--command", action="append", choices=sorted(COMMANDS),
                        help="with --commands: only these problems")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "NAME"), help=argparse.SUPPRESS)
    parser.add_argument("--time-command", metavar="ARGV_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, name = args.child
        children = {"search": child_search, "brute": child_brute, "inproc": child_inproc}
        print(json.dumps(children[mode](name)))
        return
    if args.time_command:
        print(json.dumps(time_command(json.loads(args.time_command))))
        return
    if args.commands:
        run_commands(args.command or list(COMMANDS))
        return
    if args.published:
        run_published()
        return
    run_speed(args.case or list(PROBLEMS), brute=not args.no_brute)


if __name__ == "__main__":
    main()
