"""placer init writes a commented example per input that the pydantic models accept as is."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_cli import assert_one_line_error, cli

from placer.spec import Cluster, Job, Model
from placer.spec.presets import load_cluster, load_job, load_model, read_document

LOADERS = {"cluster": (load_cluster, Cluster), "model": (load_model, Model),
           "job": (lambda p: load_job(Path(p)), Job)}


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_init_writes_a_commented_example_the_models_accept(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["init", kind], capsys)
    assert code == 0 and out == "" and f"wrote {kind}.yaml" in err
    path = tmp_path / f"{kind}.yaml"
    text = path.read_text()
    comments = [line for line in text.splitlines() if "#" in line]
    assert len(comments) >= 5  # explained, not bare
    loader, model_cls = LOADERS[kind]
    loaded = loader(str(path))
    assert isinstance(loaded, model_cls)
    # every top-level key written is a field of the model (nothing the model ignores)
    assert set(read_document(path)) <= set(model_cls.model_fields)
    code, _, err = cli(["init", kind], capsys)
    assert_one_line_error(code, err)
    assert "--force" in err and path.read_text() == text


def test_the_examples_run_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = {}
    for kind in LOADERS:
        files[kind] = tmp_path / f"my-{kind}.yaml"
        assert cli(["init", kind, "--out", str(files[kind])], capsys)[0] == 0
    code, out, err = cli(["recommend-layout", "--model", str(files["model"]), "--cluster",
                          str(files["cluster"]), "--job", str(files["job"]), "--top", "1",
                          "--no-what-if", "--quiet"], capsys)
    assert code == 0, err
    assert "my-model" in out and "4 x hgx-h100 (32 usable GPUs" in out


def test_the_kind_ignores_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.yaml"
    code, _, err = cli(["init", "Cluster", "--out", str(out)], capsys)
    assert code == 0, err
    assert isinstance(load_cluster(str(out)), Cluster)
