"""Shipped presets read by libyaml's parser give exactly what the pure-Python parser gives."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from placer.spec.presets import load_preset_yaml, load_yaml


def _preset_files() -> list[str]:
    root = resources.files("placer.spec").joinpath("presets")
    out: list[str] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                stack.append(entry)
            elif entry.name.endswith((".yaml", ".yml")):
                out.append(entry.read_text(encoding="utf-8"))
    return out


def _typed(value: object) -> object:
    """The data with every scalar's type, so 1 and 1.0 (or True and 1) do not compare equal."""
    if isinstance(value, dict):
        return {_typed(k): _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def test_every_preset_reads_alike() -> None:
    texts = _preset_files()
    assert len(texts) > 10
    for text in texts:
        assert _typed(load_preset_yaml(text)) == _typed(load_yaml(text))


@pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False), reason="PyYAML without libyaml")
def test_numbers_in_exponent_form_are_numbers_in_both() -> None:
    text = "peak: 989e12\nbw: 3.35e12\nname: 1e9x\n"
    assert load_preset_yaml(text) == load_yaml(text) == {"peak": 989e12, "bw": 3.35e12,
                                                         "name": "1e9x"}
