"""Every file placer writes validates against the JSON Schema ``placer schema NAME`` prints.

The check is jsonschema's own validator on the schema text the CLI prints, not the pydantic
model that produced the file; the schemas forbid unknown fields, so a writer that adds or
misspells a key fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers_cli import cli
from helpers_launch import plan_2x4_moe_remapped

from placer.cli.spec_commands import SCHEMA_NAMES
from placer.spec.presets import load_yaml, read_document

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "emulated-2x2"


def schema(name: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = cli(["schema", name], capsys)
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def check(name: str, document: Any, capsys: pytest.CaptureFixture[str]) -> None:
    jsonschema.validate(document, schema(name, capsys))


def test_every_schema_is_a_valid_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    for name in SCHEMA_NAMES:
        jsonschema.Draft202012Validator.check_schema(schema(name, capsys))


def test_an_unknown_fields_hint_names_the_kind_placer_schema_prints_for_that_model() -> None:
    from placer.cli.spec_commands import schemas
    from placer.spec.presets import SCHEMA_KINDS

    kinds = {model.__name__: kind for kind, model in schemas().items()}
    assert {name: kinds.get(name) for name in SCHEMA_KINDS} == SCHEMA_KINDS


def test_the_schemas_reject_an_unknown_field(capsys: pytest.CaptureFixture[str]) -> None:
    plan = json.loads((EXAMPLE / "plan.json").read_text())
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        check("plan", {**plan, "candidtes": []}, capsys)


def test_input_files_of_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    # Read as placer reads them (YAML 1.2 numbers: 2.0e11 is a number).
    for name in ("model", "cluster", "job"):
        check(name, read_document(EXAMPLE / f"{name}.yaml"), capsys)
    check("profile", read_document(EXAMPLE / "profile.yaml"), capsys)


def test_plan_estimate_and_launch_files(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from placer.launch import write_launch_files
    from placer.report.plan import plan_json

    plan = plan_2x4_moe_remapped()
    check("plan", json.loads(plan_json(plan)), capsys)
    write_launch_files(plan, 0, tmp_path / "launch")
    check("rankmap", json.loads((tmp_path / "launch" / "rankmap.json").read_text()), capsys)
    code, out, err = cli(["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                          "--nodes", "2", "--layout", "tp=2,dp=8,ep=4,zero=0", "--json"], capsys)
    assert code == 0, err
    check("estimate", json.loads(out), capsys)


def test_node_and_cluster_files_from_topology_import(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    topo = ROOT / "tests" / "data" / "topo" / "dgx_a100.txt"
    for kind, extra in (("node", []), ("cluster", ["--cluster", "--nodes", "2"])):
        out = tmp_path / f"{kind}.yaml"
        code, _, err = cli(["topology", "import", str(topo), "--gpu", "A100-80GB", *extra,
                            "--out", str(out)], capsys)
        assert code == 0, err
        check(kind, read_document(out), capsys)


def test_check_report(capsys: pytest.CaptureFixture[str]) -> None:
    config = ROOT / "tests" / "data" / "check" / "megatron_llama3_8b_tp8.sh"
    code, out, _ = cli(["check", str(config), "--cluster", "dgx-h100", "--format", "json"],
                       capsys)
    assert code in (0, 1)
    check("check", json.loads(out), capsys)


def test_verify_documents_replay_and_calibration_config(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from placer.cli.launch_command import load_plan
    from placer.spec.profile import load_link_profile
    from placer.verify.calibrate import bench_config, default_sweep, profile_yaml
    from placer.verify.output import results_document
    from placer.verify.runner import LocalLauncher
    from placer.verify.session import VerifyOptions, prepare, replay_config, verify_plan

    plan = load_plan(EXAMPLE / "plan.json")
    profile = load_link_profile(EXAMPLE / "profile.yaml")
    options = VerifyOptions(top_k=2)
    for prep in prepare(plan, range(len(plan.candidates)), profile, 0.5):
        check("replay", replay_config(prep, tmp_path, options, "gloo"), capsys)
    check("bench-config", bench_config(default_sweep(False), 2, 2), capsys)
    check("profile", load_yaml(profile_yaml(profile)), capsys)

    class Refuses(LocalLauncher):  # 2 ranks here, the plan needs 4: every candidate skipped
        def run(self, *args: object, **kwargs: object) -> object:
            raise AssertionError("a candidate of another shape must not run")

    results, summary, fb = verify_plan(plan, Refuses(2), profile, options, tmp_path / "work")
    assert {r.status for r in results} == {"skipped"}
    doc = results_document(str(EXAMPLE / "plan.json"), "local", options, "profile.yaml",
                           results, summary, fb)
    check("verify", json.loads(json.dumps(doc)), capsys)
