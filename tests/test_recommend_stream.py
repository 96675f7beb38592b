"""recommend-layout prints the answer before the what-ifs, checks its outputs before searching,
and shows progress on stderr unless --quiet."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_cli import assert_one_line_error, cli

import placer.solver
from placer.report.defaults import resolve_job
from placer.report.plan import make_plan, plan_in_steps, with_what_ifs_solved
from placer.report.tables import render_text, stream_text
from placer.spec.presets import cluster_preset, model_preset

SMALL = ["recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2",
         "--seq-len", "4096", "--global-batch", "64", "--top", "2"]


def test_streamed_report_is_the_whole_report_and_what_ifs_come_last() -> None:
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(2)
    job, _ = resolve_job(model, seq_len=4096, global_batch=64, constraints=(), precision="bf16")
    head, variants = plan_in_steps(model, cluster, job, top_k=2)
    assert head.what_ifs == [] and not any("answer" in line for line in head.plan.explanation)
    pieces: list[str] = []

    def solved_after_head():  # the head was written before any variant was solved
        for what in variants:
            assert pieces, "a what-if was solved before the answer was written"
            yield what

    rec = stream_text(head, solved_after_head(),
                      lambda solved: with_what_ifs_solved(head, solved), pieces.append)
    assert len(rec.what_ifs) == 3
    assert "".join(pieces) == render_text(rec)
    assert rec.plan.explanation == make_plan(model, cluster, job, top_k=2).plan.explanation
    assert any("The answer holds at" in line or "What would change" in line
               for line in rec.plan.explanation)


def test_emit_into_a_non_empty_folder_fails_before_the_search(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_search(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the search ran")

    monkeypatch.setattr(placer.solver, "recommend", no_search)
    full = tmp_path / "out"
    full.mkdir()
    (full / "notes.txt").write_text("mine\n")
    code, out, err = cli([*SMALL, "--emit", str(full)], capsys)
    assert_one_line_error(code, err)
    assert "--emit" in err and "notes.txt" in err and "--force" in err and out == ""
    a_file = tmp_path / "plot"
    a_file.write_text("x")
    code, _, err = cli([*SMALL, "--plot", str(a_file)], capsys)
    assert_one_line_error(code, err)
    assert "is not a folder" in err
    assert (full / "notes.txt").read_text() == "mine\n" and a_file.read_text() == "x"


def test_quiet_leaves_stderr_empty_and_stdout_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    code, loud, loud_err = cli(SMALL, capsys)
    assert code == 0 and "(searched in" in loud_err
    code, quiet, quiet_err = cli([*SMALL, "--quiet"], capsys)
    assert code == 0 and quiet_err == "" and quiet == loud
