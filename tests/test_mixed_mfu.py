"""MFU on a cluster of two GPU types is of the peaks of the GPUs the ranks run on.

The cost model prices every rank at the slowest GPU's speed (a synchronous step waits for it), and
divides the model FLOPs by every GPU at that slowest peak; on 2 DGX A100 + 2 DGX H100 that counts
32 x 312 TFLOP/s where the hardware has 16 x 312 + 16 x 989.4 (NVIDIA's dense BF16 peaks,
docs/sources.md 5.3), and MFU came out 2.1x too high. The expected figures here are the catalog's
datasheet peaks summed by hand over each candidate's rank map.
"""

from __future__ import annotations

import json

import pytest
from helpers_cli import cli

from placer.solver import recommend
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.presets import cluster_preset, model_preset

PEAK_TFLOPS = {"H100-SXM-80GB": 989.4, "A100-80GB": 312.0}  # dense BF16, NVIDIA's datasheets
LAYOUT = "tp=4,pp=2,dp=4,mbs=1,zero=1,recompute=selective,sp=on"


def _mixed() -> Cluster:
    h100, a100 = cluster_preset("dgx-h100"), cluster_preset("dgx-a100")
    return Cluster.model_validate({
        "name": "mixed",
        "node_types": [h100.node_types[0].model_dump(), a100.node_types[0].model_dump()],
        "pools": [{"node_type": h100.node_types[0].name, "count": 2},
                  {"node_type": a100.node_types[0].name, "count": 2}],
        "network": h100.network.model_dump()})


def test_each_candidates_mfu_is_of_the_gpus_it_runs_on() -> None:
    cluster = _mixed()
    job = Job(seq_len=4096, global_batch_size=64)
    result = recommend(model_preset("llama3-8b"), cluster, job, top_k=3)
    assert result.candidates
    for c in result.candidates:
        peak = sum(PEAK_TFLOPS[cluster.node_type_of(e.node).gpu.name] for e in c.rank_map)
        assert c.mfu == pytest.approx(c.tflops_per_gpu * c.layout.num_gpus / peak, rel=1e-9)
        assert c.hfu == pytest.approx(
            c.hardware_tflops_per_gpu * c.layout.num_gpus / peak, rel=1e-9)
        if c.layout.num_gpus == 32:  # every GPU: half of each type
            assert c.mfu == pytest.approx(c.tflops_per_gpu / ((312.0 + 989.4) / 2), rel=1e-9)


def test_estimate_on_a_mixed_cluster_divides_by_both_peaks(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mixed.json"
    path.write_text(_mixed().model_dump_json())
    code, out, err = cli(["estimate", "--model", "llama3-8b", "--cluster", str(path),
                          "--seq-len", "4096", "--global-batch", "64", "--layout", LAYOUT,
                          "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["mfu"] == pytest.approx(doc["tflops_per_gpu"] / ((312.0 + 989.4) / 2), rel=1e-9)


def test_one_gpu_type_keeps_its_own_peak(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["estimate", "--model", "llama3-8b", "--cluster", "dgx-a100",
                          "--nodes", "4", "--seq-len", "4096", "--global-batch", "64",
                          "--layout", LAYOUT, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["mfu"] == pytest.approx(doc["tflops_per_gpu"] / 312.0, rel=1e-12)
