"""Load placer's torchtitan files with torchtitan itself; print what torchtitan made of them.

Run with a Python that has torchtitan (0.3.x for ``py``, 0.2.x for ``toml``):
``python torchtitan_accept.py {py|toml} MANIFEST.json`` where the manifest lists
``{"id", "dir", "world_size", "num_layers"}`` cases. For each case this prints one JSON line:
the config torchtitan parsed (its own ConfigManager), the ParallelDims it built (and the device
mesh, on a fake process group: this machine has no GPUs), and the module names of every
pipeline chunk as torchtitan's own ``pipeline_llm`` computes them, with the chunks each PP rank
holds. Stubs a CPU-only machine forces: the ``fake`` process-group backend (no NCCL), and a
model stand-in that has only the layer count (``pipeline_llm`` reads nothing else before it
splits the model, which is where this script stops it). Models torchtitan has no config
function for (placer's file then has ``BASE = None``) load on ``llama3_debugmodel`` as the
base (``PLACER_TORCHTITAN_BASE``): the base supplies model, data and optimizer, which this
check does not look at; every setting compared comes from placer's file. torchtitan's float8
converter (in the 405B base config) checks for an SM89 GPU when the config is built; on this
machine its ``has_cuda_capability`` is told there is one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

DEBUG_BASE = "torchtitan.models.llama3.config_registry:llama3_debugmodel"


class _Split(Exception):
    """Raised by the stand-in for torchtitan's module splitter, carrying the chunk names."""

    def __init__(self, names: list[list[str]]) -> None:
        super().__init__("split")
        self.names = names


def _splitter(*args: Any, **kwargs: Any) -> Any:
    names = kwargs.get("module_names_per_stage")
    if names is None:
        names = args[4]
    raise _Split([list(n) for n in names])


def _degrees(p: Any) -> dict[str, Any]:
    return {k: getattr(p, k, None) for k in (
        "data_parallel_replicate_degree", "data_parallel_shard_degree",
        "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
        "expert_parallel_degree", "expert_tensor_parallel_degree",
        "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
        "pipeline_parallel_layers_per_stage", "module_fqns_per_model_part")}


def _load_py(folder: str) -> Any:
    from torchtitan.config import ConfigManager

    with contextlib.suppress(ImportError):  # no SM89/SM100 GPU here (module docstring)
        _pretend_gpu()
    sys.modules.pop("torchtitan_config", None)
    sys.path.insert(0, folder)
    text = Path(folder, "torchtitan_config.py").read_text()
    if "\nBASE = None\n" in text:
        os.environ["PLACER_TORCHTITAN_BASE"] = DEBUG_BASE
    else:
        os.environ.pop("PLACER_TORCHTITAN_BASE", None)
    try:
        return ConfigManager().parse_args(["--module", "torchtitan_config",
                                           "--config", "placer_job"])
    finally:
        sys.path.remove(folder)


def _load_toml(folder: str) -> Any:
    from torchtitan.config import ConfigManager
    return ConfigManager().parse_args(["--job.config_file", str(Path(folder, "torchtitan.toml"))])


def _pretend_gpu() -> None:
    """Tell torchtitan's quantization converters there is an SM100 GPU (this machine has
    none): float8 asks for SM89, MXFP8 for SM100 (see the module docstring)."""
    from torchtitan.components.quantization import float8, mx
    for module in (float8, mx):
        module.has_cuda_capability = lambda *args: True


def _toml_converters(config: Any, dims: Any) -> dict[str, Any]:
    """0.2: the converters torchtitan builds from ``[model] converters`` (their own __init__
    checks run: recipe, FSDP float8 all-gather, PP/CP/TP limits), with their settings."""
    _pretend_gpu()
    from torchtitan.protocols.model_converter import build_model_converters
    float8 = config.quantize.linear.float8
    try:
        built = build_model_converters(config, dims).converters
    except ImportError as exc:  # a torchao this venv does not have: the environment's, not
        built, missing = [], f"{exc}"  # the file's (the test says which)
    else:
        missing = None
    return {"names": list(config.model.converters), "import_error": missing,
            "built": [type(c).__name__ for c in built if getattr(c, "enabled", True)],
            "float8_recipe": float8.recipe_name,
            "fsdp_float8_all_gather": float8.enable_fsdp_float8_all_gather,
            "grouped_fqns": {k: list(getattr(config.quantize.grouped_mm, k).fqns)
                             for k in ("float8", "mx")}}


def _model_linears(config: Any) -> dict[str, Any]:
    """0.3: how many of the model config's linear layers and expert modules are of each
    class after placer's converters ran (Linear, Float8Linear, MXFP8Linear, ...), and the
    scaling granularity torchao's float8 config gives the converted ones (AXISWISE: rowwise)."""
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import GroupedExperts
    counts: dict[str, Any] = {}
    model = config.model_spec.model
    for cls in (Linear.Config, GroupedExperts.Config):
        for _fqn, node, _parent, _attr in model.traverse(cls):
            name = type(node).__qualname__
            counts[name] = counts.get(name, 0) + 1
            torchao = getattr(node, "_torchao_config", None)
            if torchao is not None:
                counts["float8_granularity"] = str(
                    torchao.cast_config_input.scaling_granularity)
    return counts


def _chunks_py(config: Any, dims: Any, num_layers: int) -> list[list[str]]:
    from torchtitan.distributed import pipeline_parallel as pp_mod
    pp_mod._pipeline_module_split = _splitter  # stop where torchtitan splits the model

    class ModelConfig:  # stand-in: pipeline_llm reads only the layer count before the split
        layers = [None] * num_layers

    try:
        pp_mod.pipeline_llm(None, parallel_dims=dims, training=config.training,
                            parallelism=config.parallelism, compile_config=config.compile,
                            ac_config=config.activation_checkpoint, dump_folder="",
                            device=None, model_config=ModelConfig(), parallelize_fn=None,
                            loss_fn=None)
    except _Split as split:
        return split.names
    raise AssertionError("pipeline_llm did not reach the module split")


def _chunks_toml(config: Any, dims: Any, num_layers: int) -> list[list[str]]:
    from torchtitan.distributed import pipeline_parallel as pp_mod
    pp_mod.pipeline_module_split = _splitter

    class ModelArgs:  # stand-in: pipeline_llm reads only n_layers before the split
        n_layers = num_layers

    try:
        pp_mod.pipeline_llm(None, dims, config, None, ModelArgs(), None, None)
    except _Split as split:
        return split.names
    raise AssertionError("pipeline_llm did not reach the module split")


def _ranks(config: Any, pp: int, chunks: int) -> list[list[int]]:
    """Chunk indices of each PP rank: torchtitan's looped (or V) stage assignment."""
    try:
        from torchtitan.distributed.pipeline_parallel import (
            _get_pp_rank_to_stage_indices_mapping as mapping,
        )
    except ImportError:  # 0.2.x: the same rule is inlined in pipeline_module_split (L451-471)
        from torch.distributed.pipelining.schedules import (
            ScheduleZBVZeroBubble,
            get_schedule_class,
        )
        v = get_schedule_class(config.parallelism.pipeline_parallel_schedule) is \
            ScheduleZBVZeroBubble

        def mapping(rank: int, degree: int, schedule: str, n: int) -> tuple[int, ...]:
            del schedule
            if v:
                return (rank, n - 1 - rank)
            return tuple(rank + s * degree for s in range(n // degree))
    return [list(mapping(r, pp, config.parallelism.pipeline_parallel_schedule, chunks))
            for r in range(pp)]


def check(kind: str, case: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed import ParallelDims

    out: dict[str, Any] = {"id": case["id"]}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            config = (_load_py if kind == "py" else _load_toml)(case["dir"])
        except (Exception, SystemExit) as exc:  # tyro exits on a bad field
            out["error"] = f"config: {type(exc).__name__}: {exc}"
            return out
        p = config.parallelism
        out["parallelism"] = _degrees(p)
        out["training"] = {k: getattr(config.training, k, None) for k in (
            "global_batch_size", "local_batch_size", "seq_len")}
        out["activation_checkpoint"] = (type(config.activation_checkpoint).__qualname__
                                        if kind == "py" else config.activation_checkpoint.mode)
        out["compile"] = {"enable": config.compile.enable,
                          "components": list(config.compile.components)}
        if kind == "py":
            out["model_linears"] = _model_linears(config)
        world = case["world_size"]
        try:
            if hasattr(ParallelDims, "from_config"):
                dims = ParallelDims.from_config(p, world)
            else:
                dims = ParallelDims(
                    dp_replicate=p.data_parallel_replicate_degree,
                    dp_shard=p.data_parallel_shard_degree, cp=p.context_parallel_degree,
                    tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                    ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                    world_size=world)
            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
            dims.build_mesh()
        except Exception as exc:
            out["error"] = f"ParallelDims: {type(exc).__name__}: {exc}"
            return out
        out["dims"] = {k: getattr(dims, k) for k in ("dp_replicate", "dp_shard", "cp", "tp",
                                                      "pp", "ep")}
        if kind == "toml" and config.model.converters:
            try:
                out["converters"] = _toml_converters(config, dims)
            except (Exception, SystemExit) as exc:
                out["error"] = f"converters: {type(exc).__name__}: {exc}"
                return out
        if p.pipeline_parallel_degree > 1:
            try:
                names = (_chunks_py if kind == "py" else _chunks_toml)(
                    config, dims, case["num_layers"])
            except Exception as exc:
                out["error"] = f"pipeline: {type(exc).__name__}: {exc}"
                return out
            out["chunks"] = names
            out["rank_chunks"] = _ranks(config, p.pipeline_parallel_degree, len(names))
    return out


def main() -> None:
    kind, manifest = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    for case in manifest:
        try:
            result = check(kind, case)
        except Exception:
            result = {"id": case["id"], "error": traceback.format_exc()}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
