"""bench/accuracy.py --loso-source: a fold fitted alone is the same fold as in the full table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import accuracy  # noqa: E402

SMALL = ("TRAINY_H200_2506", "TORCHTITAN_MXFP8_MOE")  # 2 + 2 rows: a fit of seconds


def _small_cases() -> list[accuracy.Case]:
    cases, _, _ = accuracy.load()
    return [c for c in cases if c.source in SMALL]


def test_a_fold_does_not_depend_on_the_processes_or_its_companions() -> None:
    cases = _small_cases()
    alone = accuracy.fit_folds(cases, [SMALL[0]], 1, 1, jobs=1)
    together = accuracy.fit_folds(cases, ["*", SMALL[1], SMALL[0]], 1, 1, jobs=2)
    assert together[2] == alone[0]
    # the held-out source's rows are predicted, the in-sample fold predicts every row
    assert len(alone[0][0]) == sum(c.source == SMALL[0] and not c.oom for c in cases)
    assert len(together[0][0]) == sum(not c.oom for c in cases)


def test_an_unknown_source_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        accuracy.main(["--loso-source", "NO_SUCH_SOURCE"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "'NO_SUCH_SOURCE' is not a source" in err and "BLOOM_REPO" in err
