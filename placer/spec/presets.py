"""Built-in presets and loading of user files (YAML or JSON) into the spec models.

Every loader turns a problem into a one-line ``PlacerError`` naming the file or field.
"""

from __future__ import annotations

import json
import math
import os
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from placer.errors import InputError, PlacerError, from_validation_error
from placer.spec.cluster import Cluster
from placer.spec.gpu import GPU
from placer.spec.job import Job
from placer.spec.model import Model

M = TypeVar("M", bound=BaseModel)
MAX_INPUT_BYTES = 64 * 1024 * 1024
MAX_INPUT_VALUES = MAX_INPUT_BYTES
"""Values a document may expand to: each takes a byte or more of the file, unless YAML aliases
repeat it."""


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that reads ``300.0e9`` and ``1e9`` as numbers, as YAML 1.2 and the editors that
    check files against ``placer schema`` do (PyYAML's YAML 1.1 makes them strings)."""


_PresetLoader: type[Any] = _YamlLoader
if getattr(yaml, "__with_libyaml__", False):

    class _CYamlLoader(yaml.CSafeLoader):
        """``_YamlLoader`` with libyaml's parser: the same resolver, so the same data."""

    _PresetLoader = _CYamlLoader

for _loader in {_YamlLoader, _PresetLoader}:
    _loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?([0-9][0-9_]*(\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )


def load_yaml(text: str) -> Any:
    """Parse YAML text the way every placer input and preset is read."""
    return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader: plain data only


def load_preset_yaml(text: str) -> Any:
    """A shipped preset file, read as ``load_yaml`` reads it but by libyaml's parser where
    PyYAML has it: every command reads the model, GPU, recipe and stack tables, and the pure-
    Python parser took ~0.15 s of each. A user's file keeps ``load_yaml``, whose error messages
    and marks ``read_document`` reports. tests/test_preset_yaml.py checks both read every preset
    alike.
    """
    return yaml.load(text, Loader=_PresetLoader)


def _preset_text(name: str) -> str:
    return resources.files("placer.spec").joinpath("presets", name).read_text(encoding="utf-8")


@cache
def _gpu_table() -> dict[str, dict[str, Any]]:
    return load_preset_yaml(_preset_text("gpus.yaml"))


@cache
def _model_table() -> dict[str, dict[str, Any]]:
    return load_preset_yaml(_preset_text("models.yaml"))


@cache
def _cluster_names() -> tuple[str, ...]:
    folder = resources.files("placer.spec").joinpath("presets", "clusters")
    return tuple(sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()
                        if p.name.endswith(".yaml")))


def gpu_names() -> list[str]:
    return list(_gpu_table())


def model_names() -> list[str]:
    return list(_model_table())


def cluster_names() -> list[str]:
    return list(_cluster_names())


@cache
def gpu_preset(name: str) -> GPU:
    table = _gpu_table()
    if name not in table:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(table)}")
    return GPU.model_validate({"name": name, **table[name]})


@cache
def model_preset(name: str) -> Model:
    return Model.model_validate({"name": name, **_model_table()[name]})


@cache
def cluster_preset(name: str) -> Cluster:
    text = _preset_text(f"clusters/{name}.yaml")
    return Cluster.model_validate(load_preset_yaml(text))


def validated(model_cls: type[M], data: Any, source: str) -> M:
    """``model_cls.model_validate`` with a one-line error naming ``source`` and the field."""
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        kind = INIT_KINDS.get(model_cls.__name__)
        raise from_validation_error(exc, source, f"placer init {kind}" if kind else None,
                                    SCHEMA_KINDS.get(model_cls.__name__)) from None


INIT_KINDS = {"Cluster": "cluster", "Model": "model", "Job": "job"}
"""Input files ``placer init`` writes a commented example of, by model class."""

SCHEMA_KINDS = {"Model": "model", "Cluster": "cluster", "NodeType": "node", "Job": "job",
                "Layout": "layout", "LinkProfile": "profile", "Plan": "plan", "Stack": "stack"}
"""The ``placer schema`` kind of each document read through ``validated``, by model class, for
the unknown-field hint; the CLI's SCHEMA_NAMES holds every kind (tests/test_schemas.py checks
they agree)."""


def read_document(path: Path) -> Any:
    """Parse a YAML or JSON file; a missing, huge, truncated or malformed file is a PlacerError."""
    if not path.is_file():
        raise PlacerError(f"{path}: no such file")
    if path.stat().st_size > MAX_INPUT_BYTES:
        raise PlacerError(f"{path}: file is larger than {MAX_INPUT_BYTES // 2**20} MiB")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlacerError(f"{path}: cannot read as UTF-8 text ({exc.__class__.__name__})") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text, parse_constant=_reject_constant)
        else:
            data = load_yaml(text)
    except json.JSONDecodeError as exc:
        raise PlacerError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise PlacerError(f"{where}: invalid YAML: {problem}") from None
    except ValueError as exc:
        raise PlacerError(f"{path}: {exc}") from None
    except RecursionError:
        raise PlacerError(f"{path}: nested too deeply to be a placer input") from None
    _check_values(data, str(path))
    return data


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed; use a finite number")


def _check_values(data: Any, where: str) -> None:
    """Reject NaN and infinities, and YAML aliases that expand past ``MAX_INPUT_VALUES`` values
    ("billion laughs": ten aliases of ten aliases... is 10**10 values from a few hundred bytes).

    Each list or mapping is visited once however often aliases repeat it, so this is linear in
    the file, not in its expansion.
    """
    expanded: dict[int, int] = {}

    def visit(node: Any, where: str) -> int:
        if isinstance(node, float) and not math.isfinite(node):
            raise PlacerError(f"{where}: {node} is not allowed; use a finite number")
        if not isinstance(node, dict | list):
            return 1
        if id(node) in expanded:
            return expanded[id(node)]
        items = ([(f"{where}: {key}", value) for key, value in node.items()]
                 if isinstance(node, dict) else [(where, value) for value in node])
        total = 1
        for child_where, child in items:
            total += visit(child, child_where)
            if total > MAX_INPUT_VALUES:
                raise PlacerError(f"{where}: expands to more than {MAX_INPUT_VALUES:,} values "
                                  "(YAML aliases repeating aliases?); write the values out")
        expanded[id(node)] = total
        return total

    try:
        visit(data, where)
    except RecursionError:
        raise PlacerError(f"{where}: nested too deeply to be a placer input") from None


def _looks_like_path(ref: str) -> bool:
    suffix = Path(ref).suffix.lower()
    return suffix in (".yaml", ".yml", ".json") or "/" in ref or Path(ref).exists()


def preset_name(ref: str, names: list[str]) -> str | None:
    """The preset ``ref`` names, ignoring case (``Llama3-70B`` is ``llama3-70b``); None if none."""
    if ref in names:
        return ref
    folded = {name.casefold(): name for name in names}
    return folded.get(ref.casefold())


def unknown_preset(option: str, ref: str, names: list[str], *,
                   or_file: bool | str = True) -> InputError:
    """The error for a name that is neither a preset nor a file: the closest presets first.

    ``or_file`` is what else the option takes: a file (True), nothing (False), or those words.
    """
    import difflib

    folded = {name.casefold(): name for name in names}
    key = ref.casefold()
    # a name the text starts (or is part of) comes first: 'h100' is H100-SXM-80GB, 'megatron'
    # megatron-core@0.20, which spelling distance alone ranks below shorter names (H800)
    held = [name for fold, name in folded.items() if len(key) >= 2 and key in fold]
    held.sort(key=lambda name: not name.casefold().startswith(key))
    # spaces and underscores read as the catalog's hyphens ('H100 SXM 80GB'); then a name with
    # the text's first word as one of its own: 'H200 NVL' (a vendor's spelling) has 'h200', as
    # H200-141GB does
    words = [w for w in re.split(r"[\s_-]+", key) if w]
    spaced = "-".join(words)
    by_word = [name for fold, name in folded.items()
               if len(words) > 1 and len(words[0]) >= 2 and words[0] in fold.split("-")]
    spelled = [folded[m] for m in difflib.get_close_matches(spaced, folded, n=3, cutoff=0.6)]
    close = list(dict.fromkeys([*held, *spelled, *by_word]))[:3]
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    tail = " or a file" if or_file is True else f"; {or_file}" if or_file else ""
    return InputError(option, ref, f"{hint}use a preset ({', '.join(names)}; placer presets)"
                                   f"{tail}")


GPU_NOT_LISTED = ("a GPU not listed: a cluster file whose node type's gpu is a mapping of its "
                  "fields (placer init cluster)")
"""What a GPU name outside the catalog can be given as instead (``--gpu`` takes no file)."""


def load_model(ref: str) -> Model:
    """A preset name (any case), a placer model file, or a Hugging Face ``config.json`` or the
    folder holding one (what ``huggingface-cli download`` writes)."""
    name = preset_name(ref, model_names())
    if name is not None:
        return model_preset(name)
    if not _looks_like_path(ref):
        raise unknown_preset("--model", ref, model_names())
    path = Path(ref)
    if path.is_dir():
        path = _hf_config_file(path)
    data = read_document(path)
    if not isinstance(data, dict):
        raise PlacerError(f"{path}: expected a mapping of model fields")
    from placer.spec.hf import is_hf_config, model_from_hf_config

    if is_hf_config(data):
        # Hub checkouts hold <model>/config.json: name those after their folder, others after
        # the file itself.
        folder = _hf_folder_name(path) if path.name == "config.json" else ""
        return model_from_hf_config(data, default_name=folder or path.stem, source=str(path))
    data.setdefault("name", path.stem)
    return validated(Model, data, str(path))


def _hf_config_file(folder: Path) -> Path:
    """The config.json of a model folder: its own (``hf download --local-dir``), or, in a Hub
    cache entry (``models--ORG--NAME``, what ``hf download`` fills without ``--local-dir``),
    that of the snapshot ``refs/main`` names (huggingface.co/docs/hub/local-cache)."""
    if (folder / "config.json").is_file():
        return folder / "config.json"
    snapshots, main = folder / "snapshots", folder / "refs" / "main"
    if snapshots.is_dir():
        head = main.read_text(encoding="utf-8").strip() if main.is_file() else ""
        found = ([snapshots / head] if head else
                 sorted(p for p in snapshots.iterdir() if (p / "config.json").is_file()))
        if len(found) == 1 and (found[0] / "config.json").is_file():
            return found[0] / "config.json"
        if len(found) > 1:
            raise InputError("--model", str(folder), "it caches several snapshots and no "
                             f"refs/main; give one: {found[0]}")
    raise PlacerError(f"{folder}: a folder without config.json; give a model file or a "
                      "Hugging Face model folder")


def _hf_folder_name(config: Path) -> str:
    """The model's name from where its config.json sits: the folder, or for a Hub cache
    snapshot (``models--ORG--NAME/snapshots/HASH/config.json``, a link into ``blobs/``) NAME."""
    parent = Path(os.path.abspath(config)).parent  # '..' folded, links not followed
    entry = parent.parent.parent.name
    if parent.parent.name == "snapshots" and entry.startswith("models--"):
        return entry.rsplit("--", 1)[-1]
    return parent.name


def load_cluster(ref: str) -> Cluster:
    """A preset name (any case) or a cluster file."""
    name = preset_name(ref, cluster_names())
    if name is not None:
        return cluster_preset(name)
    if not _looks_like_path(ref):
        raise unknown_preset("--cluster", ref, cluster_names())
    path = Path(ref)
    data = read_document(path)
    if not isinstance(data, dict):
        raise PlacerError(f"{path}: expected a mapping of cluster fields")
    data.setdefault("name", path.stem)
    return validated(Cluster, data, str(path))


def load_gpu(ref: str, option: str = "--gpu") -> GPU:
    """A GPU preset by name, any case (``h100-sxm-80gb``); the one rule for GPU names, on the
    command line and in a cluster file's ``gpu:``."""
    name = preset_name(ref, gpu_names())
    if name is None:
        raise unknown_preset(option, ref, gpu_names(), or_file=GPU_NOT_LISTED)
    return gpu_preset(name)


def load_job(path: Path) -> Job:
    data = read_document(path)
    if not isinstance(data, dict):
        raise PlacerError(f"{path}: expected a mapping of job fields")
    return validated(Job, data, str(path))
