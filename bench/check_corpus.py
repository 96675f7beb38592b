"""Print the ``placer check`` corpus table: right / false error / missed / unreadable by dialect.

The corpus and the expert verdicts are tests/data/check_corpus/corpus.json (see its README);
tests/test_check_corpus.py asserts every row is right, this prints the counts.
Run: .venv/bin/python bench/check_corpus.py
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_check_corpus import ENTRIES, outcome, run_entry  # noqa: E402

COLUMNS = ("right", "false error", "missed", "unreadable")


def main() -> None:
    table: dict[str, Counter[str]] = {}
    wrong = []
    for entry in ENTRIES:
        kind = "real" if "repo" in entry else "derived"
        result = outcome(entry, run_entry(entry))
        table.setdefault(f"{entry['dialect']} ({kind})", Counter())[result] += 1
        if result != "right":
            wrong.append((entry["file"], result))
    print(f"{'dialect':<30}" + "".join(f"{c:>13}" for c in COLUMNS) + f"{'files':>8}")
    total: Counter[str] = Counter()
    for dialect in sorted(table):
        total.update(table[dialect])
        print(f"{dialect:<30}" + "".join(f"{table[dialect][c]:>13}" for c in COLUMNS)
              + f"{sum(table[dialect].values()):>8}")
    print(f"{'all':<30}" + "".join(f"{total[c]:>13}" for c in COLUMNS)
          + f"{sum(total.values()):>8}")
    for name, result in wrong:
        print(f"  {result}: {name}")
    print(json.dumps({"real files": len({e["file"] for e in ENTRIES if "repo" in e}),
                      "entries": len(ENTRIES)}))


if __name__ == "__main__":
    main()
