"""Rerun every example and rewrite its outputs: output.txt, plan.json and plots/*.png.

Run from the repository root:  .venv/bin/python examples/regenerate.py [NAME ...]

Each example folder holds ``command.txt``, the exact command a user types from the repository
root. This script parses it with the command's own option parser and runs the same code the
command runs, in process, so ``output.txt`` is byte-for-byte what the command prints and
``plan.json`` what ``--json`` prints. ``tests/test_examples.py`` reruns them and compares.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from placer.report.plan import Recommendation

EXAMPLES = Path(__file__).resolve().parent
ROOT = EXAMPLES.parent


NOT_RECOMMEND_EXAMPLES = ("ci", "emulated-2x2")
"""Folders with other kinds of examples (CI gate, emulated cluster), kept by their own scripts."""


def example_dirs(names: list[str] | None = None) -> list[Path]:
    """Every recommend-layout example folder (one with a command.txt), sorted by name."""
    found = sorted(p.parent for p in EXAMPLES.glob("*/command.txt")
                   if p.parent.name not in NOT_RECOMMEND_EXAMPLES)
    if names:
        found = [p for p in found if p.name in names]
    return found


def command_argv(example: Path) -> list[str]:
    """The arguments after ``placer recommend-layout`` in the example's command.txt."""
    words = shlex.split((example / "command.txt").read_text(encoding="utf-8"), comments=True)
    if words[:2] != ["placer", "recommend-layout"]:
        raise SystemExit(f"{example}/command.txt must start with 'placer recommend-layout'")
    return words[2:]


def run_example(example: Path) -> Recommendation:
    """Run an example's command in process (from the repository root) and return its result."""
    from placer.cli.recommend_command import args_from_argv, recommend

    return recommend(args_from_argv(command_argv(example)))


def main(argv: list[str]) -> int:
    import os

    from placer.report.plan import plan_json
    from placer.report.plots import plot_recommendation
    from placer.report.tables import render_text

    os.chdir(ROOT)
    for example in example_dirs(argv):
        started = time.perf_counter()
        rec = run_example(example)
        (example / "output.txt").write_text(render_text(rec), encoding="utf-8")
        (example / "plan.json").write_text(plan_json(rec.plan), encoding="utf-8")
        plot_recommendation(rec, example / "plots", formats=("png",))
        best = rec.plan.candidates[0].layout.compact()
        print(f"{example.name}: {best} ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
