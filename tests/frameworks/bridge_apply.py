"""Megatron-Bridge 0.3.1 merges placer's megatron_bridge_overrides.yaml into a recipe and runs it.

``python bridge_apply.py MANIFEST.json``; each case ``{"id", "dir", "model": {...}, "world_size",
"gpu"}``: megatron_accept.py's, and the placer name of the plan's GPU. Bridge's YAML path, as its
own scripts run it (NVIDIA-NeMo/Megatron-Bridge@3865df2
tutorials/recipes/llama/02_pretrain_with_yaml.py): a recipe function builds a ``ConfigContainer``,
``process_config_with_overrides(config, config_filepath=...)`` (training/utils/omegaconf_utils.py)
merges the file into it, and ``pretrain()`` calls ``runtime_config_update`` (training/config.py
L1843-1875: the named mixed-precision recipe, the data-parallel size,
``CommOverlapConfig.finalize()/setup()``, then ``ConfigContainer.validate()``, which finalizes
every section, megatron-core's ``TransformerConfig.__post_init__`` checks included). Both run here,
from Bridge's own source, on each case's file against two recipes:

* ``none``: recipes/common.py ``_pretrain_common()`` itself (``comm_overlap=None``,
  ``mixed_precision="bf16_mixed"``; the Qwen2/3, Qwen3-MoE, GPT-OSS, Gemma and GLM-4.5 recipes
  start from it and set no comm_overlap), its model a provider of the plan's dimensions, as a
  recipe sets it;
* ``userbuffers``: the same plus the two lines recipes/llama/llama3.py
  ``llama3_70b_pretrain_config`` adds (L737-743): ``CommOverlapConfig(tp_comm_overlap=True,
  tp_comm_overlap_cfg=userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192)`` and ``bf16_mixed()``.

Per recipe the result is the first error, or every key the file sets as the container holds it
after the merge (``merged``) and after ``runtime_config_update`` (``final``), and the overlaps the
run is left with (``effective``).

What a CPU-only machine forces, and nothing else: Bridge's package ``__init__``s import AutoBridge
(transformers) and every model family, so each package is entered in ``sys.modules`` bare (only
its ``__path__``) and each module loads from its own file; ``megatron.bridge.models`` is given the
two classes training/ imports from it. recipes/common.py imports peft/lora.py, which imports
transformer_engine (a CUDA build) at import time and is used only by the SFT/PEFT recipes: the
file's other imports and ``_pretrain_common`` are compiled from it. ``comm_overlap.HAVE_TE`` is
set True (the GPU machines Bridge runs on have Transformer Engine; without it setup() turns TP
overlap off with a warning and never reaches the tuned-config branch); and, as in
megatron_accept.py, the Transformer Engine version megatron-core asks for MoE with FP8
(``_stub_te_version``). With the flex dispatcher, ``validate()`` asks the GPU's properties
(training/flex_dispatcher_backend.py L72-84: DeepEP on compute capability 8.x/9.x, B200, B300):
``torch.cuda.get_device_properties`` answers for the plan's GPU (``DEVICES``).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import io
import json
import logging
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from megatron_accept import _stub_te_version

RECIPES = ("none", "userbuffers")
# placer GPU name prefix -> (compute capability major, minor, the name torch reports): NVIDIA's
# CUDA GPU list (developer.nvidia.com/cuda-gpus: H100/H200 9.0, A100 8.0, B200/GB200 10.0).
DEVICES = {"H100": (9, 0, "NVIDIA H100 80GB HBM3"), "H200": (9, 0, "NVIDIA H200"),
           "A100": (8, 0, "NVIDIA A100-SXM4-80GB"), "B200": (10, 0, "NVIDIA B200"),
           "GB200": (10, 0, "NVIDIA GB200")}
ABSENT = "<absent>"  # a key the container's section does not have


class _Collect(logging.Handler):
    """Bridge's warnings (a key _apply_overrides skipped, a _target_ it could not instantiate)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def load_bridge(src: Path) -> dict[str, Any]:
    """Bridge's modules from ``src`` (the unpacked wheel), without its package __init__s."""
    root = src / "megatron" / "bridge"
    for init in sorted(root.rglob("__init__.py")):
        name = ".".join(init.parent.relative_to(src).parts)
        package = types.ModuleType(name)
        package.__path__ = [str(init.parent)]
        sys.modules[name] = package
    gpt = importlib.import_module("megatron.bridge.models.gpt_provider")
    t5 = importlib.import_module("megatron.bridge.models.t5_provider")
    models = sys.modules["megatron.bridge.models"]
    models.GPTModelProvider = gpt.GPTModelProvider  # type: ignore[attr-defined]
    models.T5ModelProvider = t5.T5ModelProvider  # type: ignore[attr-defined]
    overlap = importlib.import_module("megatron.bridge.training.comm_overlap")
    overlap.HAVE_TE = True
    common = root / "recipes" / "common.py"
    tree = ast.parse(common.read_text())
    skipped = {"megatron.bridge.peft.lora", "megatron.bridge.recipes.utils.finetune_utils"}
    body = [node for node in tree.body
            if (isinstance(node, ast.Import | ast.ImportFrom)
                and getattr(node, "module", None) not in skipped)
            or (isinstance(node, ast.FunctionDef) and node.name == "_pretrain_common")]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body, []), str(common), "exec"), namespace)  # noqa: S102
    return {
        "pretrain_common": namespace["_pretrain_common"],
        "overlap": overlap,
        "config": importlib.import_module("megatron.bridge.training.config"),
        "mixed": importlib.import_module("megatron.bridge.training.mixed_precision"),
        "omegaconf": importlib.import_module("megatron.bridge.training.utils.omegaconf_utils"),
        "gpt": gpt.GPTModelProvider,
        "mla": importlib.import_module("megatron.bridge.models.mla_provider").MLAModelProvider,
    }


def _container(bridge: dict[str, Any], recipe: str, model: dict[str, Any], mla: bool) -> Any:
    import torch.nn.functional as F  # noqa: N812

    cfg = bridge["pretrain_common"]()
    kw: dict[str, Any] = {
        "num_layers": model["num_layers"], "hidden_size": model["hidden_size"],
        "num_attention_heads": model["num_attention_heads"],
        "ffn_hidden_size": model["ffn_hidden_size"], "kv_channels": model["head_dim"],
        "num_query_groups": model["num_kv_heads"], "add_bias_linear": model["add_bias_linear"]}
    if model["gated_mlp"]:
        kw.update(activation_func=F.silu, gated_linear_unit=True)
    if model["num_experts"]:
        kw.update(num_moe_experts=model["num_experts"],
                  moe_ffn_hidden_size=model["expert_ffn_hidden_size"],
                  moe_router_topk=model["top_k"])
    cfg.model = (bridge["mla"] if mla else bridge["gpt"])(**kw)
    if recipe == "userbuffers":
        overlap = bridge["overlap"]
        cfg.comm_overlap = overlap.CommOverlapConfig(
            tp_comm_overlap=True,
            tp_comm_overlap_cfg=overlap.userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192)
        cfg.mixed_precision = bridge["mixed"].bf16_mixed()
    return cfg


def _plain(value: Any) -> Any:
    """A value as JSON holds it (dataclasses by class name: a section that is one)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"<{type(value).__name__}>"
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _read(cfg: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """Every key the file sets, read back from the container (ABSENT when not there)."""
    out: dict[str, Any] = {}
    for section, keys in doc.items():
        held = getattr(cfg, section, ABSENT)
        if not isinstance(keys, dict):
            out[section] = _plain(held) if isinstance(held, str) else f"<{type(held).__name__}>"
            continue
        out[f"{section}:type"] = type(held).__name__
        for key in keys:
            if key == "_target_":
                continue
            value = held.get(key, ABSENT) if isinstance(held, dict) else getattr(held, key,
                                                                               ABSENT)
            out[f"{section}.{key}"] = _plain(value)
    return out


@contextlib.contextmanager
def _device(gpu: str) -> Any:
    """``torch.cuda.get_device_properties`` as on ``gpu`` (unknown GPUs: unchanged)."""
    import torch

    found = [v for k, v in DEVICES.items() if gpu.startswith(k)]
    if not found:
        yield
        return
    major, minor, name = found[0]
    real = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda *_: types.SimpleNamespace(  # type: ignore[assignment]
        major=major, minor=minor, name=name)
    try:
        yield
    finally:
        torch.cuda.get_device_properties = real


def apply(bridge: dict[str, Any], case: dict[str, Any], recipe: str) -> dict[str, Any]:
    import yaml

    path = Path(case["dir"], "megatron_bridge_overrides.yaml")
    doc = yaml.safe_load(path.read_text())
    mla = bool(doc.get("model", {}).get("multi_latent_attention"))
    out: dict[str, Any] = {}
    sink, collect = io.StringIO(), _Collect()
    logging.getLogger().addHandler(collect)
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            cfg = _container(bridge, recipe, case["model"], mla)
            cfg = bridge["omegaconf"].process_config_with_overrides(cfg,
                                                                    config_filepath=str(path))
            out["merged"] = _read(cfg, doc)
            os.environ["WORLD_SIZE"] = str(case["world_size"])
            with _device(case["gpu"]):
                bridge["config"].runtime_config_update(cfg)
        except Exception as exc:  # noqa: BLE001 -- any failure is the finding
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["where"] = traceback.format_exc(limit=-3)
            return out
        finally:
            logging.getLogger().removeHandler(collect)
            out["warnings"] = collect.messages
    out["final"] = _read(cfg, doc)
    out["effective"] = {"model.tp_comm_overlap": cfg.model.tp_comm_overlap,
                        "model.overlap_moe_expert_parallel_comm":
                            cfg.model.overlap_moe_expert_parallel_comm,
                        "ddp.overlap_grad_reduce": cfg.ddp.overlap_grad_reduce,
                        "ddp.overlap_param_gather": cfg.ddp.overlap_param_gather}
    return out


def main() -> None:
    logging.getLogger().setLevel(logging.WARNING)
    _stub_te_version()
    src = Path(os.environ["PLACER_MEGATRON_BRIDGE_SRC"])
    bridge = load_bridge(src)
    for case in json.loads(Path(sys.argv[1]).read_text()):
        result: dict[str, Any] = {"id": case["id"]}
        for recipe in RECIPES:
            result[recipe] = apply(bridge, case, recipe)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
