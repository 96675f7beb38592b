"""The memory-term fit behind ``placer calibrate --real-model`` (placer/verify/memory_fit.py),
on peaks written out by hand, and the command's input errors. The end-to-end run on measured
peaks is tests/test_verify_model.py::test_calibrate_fits_memory_terms_that_predict_the_...)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_cli import assert_one_line_error, cli

from placer.errors import PlacerError
from placer.verify.memory_fit import MemoryPoint, fit_memory

MIB = 2**20


def _points(scale: float, overhead: int) -> list[MemoryPoint]:
    """Peaks of four runs that hold exactly ``static + overhead + scale x dynamic``."""
    shapes = [(20 * MIB, 12 * MIB), (12 * MIB, 9 * MIB), (12 * MIB, 5 * MIB), (24 * MIB, 6 * MIB)]
    return [MemoryPoint(f"run {i}", s, d, round(s + overhead + scale * d))
            for i, (s, d) in enumerate(shapes)]


def test_the_fit_recovers_a_scale_and_an_overhead_that_hold_exactly() -> None:
    fit = fit_memory(_points(1.2, 3 * MIB // 2), "cpu")
    assert fit.freed == "scale and overhead"
    assert fit.profile.activation_scale == pytest.approx(1.2, rel=1e-3)
    assert fit.profile.overhead_bytes == pytest.approx(1.5 * MIB, rel=1e-3)
    assert fit.profile.fitted_candidates == 4 and fit.profile.device == "cpu"
    assert max(abs(e) for e in fit.errors(True)) < 1e-4
    # before the fit the model alone under-predicts every peak by the missing terms
    assert all(e < 0 for e in fit.errors(False))


def test_one_run_or_a_negative_overhead_fits_the_scale_alone() -> None:
    [one] = _points(1.1, 0)[:1]
    alone = fit_memory([one], None)
    assert alone.freed == "scale" and alone.profile.overhead_bytes == 0
    assert alone.profile.activation_scale == pytest.approx(1.1, rel=1e-3)
    # peaks that would need memory taken away from every run: no negative overhead
    points = [MemoryPoint(p.label, p.static_bytes, p.dynamic_bytes, p.measured_bytes - 2 * MIB)
              for p in _points(1.3, 0)]
    fit = fit_memory(points, None)
    assert fit.freed == "scale" and fit.profile.overhead_bytes == 0


def test_peaks_the_model_cannot_have_produced_are_refused() -> None:
    wrong = [MemoryPoint("run 0", 10 * MIB, MIB, 400 * MIB)]  # 390 MiB more than predicted
    with pytest.raises(PlacerError, match="dynamic memory x"):
        fit_memory(wrong, None)
    with pytest.raises(PlacerError, match="no candidate ran"):
        fit_memory([], None)


def test_calibrate_real_model_input_errors(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"format": "placer-bench/1"}))
    code, _, err = cli(["calibrate", "--real-model", str(bench)], capsys)
    assert_one_line_error(code, err)
    assert "placer-verify-real-model/1" in err
    code, _, err = cli(["calibrate", "--profile", str(bench)], capsys)
    assert_one_line_error(code, err)
    assert "--real-model" in err


def test_check_uses_a_profiles_memory_terms(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A plan that fits its 4 GiB emulated GPUs is over capacity once a profile says every rank
    holds 5 GB more than the model's tensors (placer check --profile)."""
    from placer.report.plan import plan_json
    from placer.spec import Job, Model
    from placer.verify.cpu_cluster import emulated_cluster, emulated_cluster_document
    from placer.verify.plans import plan_for_layouts

    model = Model(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
                  ffn_hidden_size=256, vocab_size=1024)
    plan = plan_for_layouts(model, emulated_cluster(1, 2, None), Job(seq_len=64,
                            global_batch_size=2), [("tp=2,mbs=1", "tp", "TP")])
    (tmp_path / "plan.json").write_text(plan_json(plan))
    (tmp_path / "big.yaml").write_text("format: placer-link-profile/1\nmemory:\n"
                                       "  activation_scale: 1.0\n  overhead_bytes: 5000000000\n")
    code, out, _ = cli(["check", str(tmp_path / "plan.json")], capsys)
    assert code == 0 and "memory-over-capacity" not in out, out
    code, out, _ = cli(["check", str(tmp_path / "plan.json"), "--profile",
                        str(tmp_path / "big.yaml")], capsys)
    assert code == 1 and "memory-over-capacity" in out, out
    # recommend-layout's search reads the same terms: nothing fits under that profile.
    (tmp_path / "model.json").write_text(model.model_dump_json())
    (tmp_path / "cpu.json").write_text(json.dumps(emulated_cluster_document(1, 2, None)))
    args = ["recommend-layout", "--model", str(tmp_path / "model.json"), "--cluster",
            str(tmp_path / "cpu.json"), "--seq-len", "64", "--global-batch", "2", "--top", "1",
            "--no-what-if", "--quiet"]
    code, out, err = cli(args, capsys)
    assert code == 0, err
    code, _, err = cli(args + ["--profile", str(tmp_path / "big.yaml")], capsys)
    assert_one_line_error(code, err)
    assert "no layout fits in GPU memory" in err
