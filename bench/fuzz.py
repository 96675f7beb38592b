"""Fuzz the recommender: N random (model, cluster, job) triples, counted by outcome.

Each triple (tests/strategies.py: edge cases included) must end in a plan that passes every
invariant (``placer check``, memory, rank-map bijection, group sizes, launch files) or in a
one-line infeasibility reason; anything else is a crash. Prints the counts, how often each edge
case ran, the wall time, and each distinct crash with a reproduction line.

    .venv/bin/python bench/fuzz.py                 # 10,000 examples, seed 20261129
    .venv/bin/python bench/fuzz.py --examples 500 --jobs 2

Exit status 1 when any crash was seen. Generation is reproducible: a fixed seed, no example
database; ``--jobs`` splits the examples over processes by seed, so counts depend on it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from strategies import describe, profiles, run_case, triples  # noqa: E402

DEFAULT_EXAMPLES = 10_000
DEFAULT_SEED = 20261129
WHAT_IF_EVERY = 20
"""Every 20th example also runs the what-if searches (three more solver runs each)."""


def fuzz(examples: int, seed_value: int) -> dict[str, object]:
    """Run ``examples`` triples from one seed; return counts, tags, crashes and slowest cases."""
    kinds: Counter[str] = Counter()
    tags: Counter[str] = Counter()
    crashes: dict[str, str] = {}
    slowest: list[tuple[float, str]] = []

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(triples(), st.one_of(st.none(), st.none(), st.none(), profiles()))
    def one(triple: tuple[object, object, object], profile: object) -> None:
        model, cluster, job = triple
        started = time.perf_counter()
        what_ifs = sum(kinds.values()) % WHAT_IF_EVERY == 0
        outcome = run_case(model, cluster, job, with_what_ifs=what_ifs,  # type: ignore[arg-type]
                           profile=profile)  # type: ignore[arg-type]
        tags.update(["with what-ifs"] if what_ifs else [])
        elapsed = time.perf_counter() - started
        kinds[outcome.kind] += 1
        tags.update(outcome.tags)
        if outcome.kind == "crash":
            crashes.setdefault(outcome.detail, describe(model, cluster, job))  # type: ignore[arg-type]
        done = sum(kinds.values())
        if done % 500 == 0:
            print(f"  [seed {seed_value}] {done} examples, {kinds['crash']} crashes",
                  file=sys.stderr, flush=True)
        slowest.append((elapsed, describe(model, cluster, job)))  # type: ignore[arg-type]
        slowest.sort(reverse=True)
        del slowest[3:]

    one()
    return {"kinds": kinds, "tags": tags, "crashes": crashes, "slowest": slowest}


def _worker(args: tuple[int, int]) -> dict[str, object]:
    return fuzz(*args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    shares = [args.examples // args.jobs + (i < args.examples % args.jobs)
              for i in range(args.jobs)]
    work = [(n, args.seed + i) for i, n in enumerate(shares) if n]
    if len(work) == 1:
        results = [fuzz(*work[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(len(work)) as pool:
            results = pool.map(_worker, work)
    kinds: Counter[str] = Counter()
    tags: Counter[str] = Counter()
    crashes: dict[str, str] = {}
    slowest: list[tuple[float, str]] = []
    for result in results:
        kinds.update(result["kinds"])  # type: ignore[arg-type]
        tags.update(result["tags"])  # type: ignore[arg-type]
        for detail, repro in result["crashes"].items():  # type: ignore[attr-defined]
            crashes.setdefault(detail, repro)
        slowest += result["slowest"]  # type: ignore[operator]
    wall_s = time.perf_counter() - started
    total = sum(kinds.values())
    print(f"fuzz: {total} examples (seed {args.seed}, {len(work)} process(es)) in {wall_s:.0f} s")
    print(f"  plans:      {kinds['plan']}")
    print(f"  infeasible: {kinds['infeasible']}")
    print(f"  crashes:    {kinds['crash']}")
    print("edge cases run:")
    for tag, count in sorted(tags.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {tag:<26} {count}")
    print("slowest examples:")
    for elapsed, repro in sorted(slowest, reverse=True)[:3]:
        print(f"  {elapsed:6.1f} s  {repro[:300]}")
    for detail, repro in sorted(crashes.items()):
        print(f"CRASH {detail}\n  {repro}")
    return 1 if kinds["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
