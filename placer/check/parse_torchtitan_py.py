"""Read torchtitan's Python configs (0.3 and newer): one ParsedConfig per config function.

torchtitan replaced its TOML files with Python functions returning ``Trainer.Config``
(torchtitan/models/<model>/config_registry.py): degrees are keywords of
``ParallelismConfig(...)`` or assignments ``config.parallelism.<key> = N``, batch and sequence
those of ``TrainingConfig(...)`` / ``config.training.<key>``, recomputation
``activation_checkpoint=FullAC.Config()`` / ``SelectiveAC.Config()`` / ``None``, and the model
``model_registry("<flavor>")`` of the registry's own model (the package it sits in). The file
is read with ``ast``, never imported or run; a value that is not a literal is unresolved.
placer launch's torchtitan_config.py names its base config in ``BASE = 'module:function'``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from placer.check.parse_torchtitan import (
    COMPILE_COMPONENTS,
    DEFAULT_AC_OPTION,
    RESHARD_KEY,
    TORCHTITAN_ORDER,
    fsdp_zero_stage,
    preset_for,
    read_fp8,
    read_recompute,
    read_reshard,
    torchtitan_stack,
)
from placer.check.parsed import ParsedConfig, Settings
from placer.check.torchtitan_flavors import flavor_model
from placer.dialects import torchtitan
from placer.errors import PlacerError
from placer.mesh import parse_order

# 0.3's activation_checkpoint classes (distributed/activation_checkpoint.py) as the TOML's
# (mode, selective_ac_option): SelectiveAC is per-op SAC only, the Trainer.Config default
_RECOMPUTE: dict[str, tuple[str, str]] = {"FullAC": ("full", DEFAULT_AC_OPTION),
                                          "SelectiveAC": ("selective", "op"),
                                          "MemoryBudgetAC": ("memory_budget", DEFAULT_AC_OPTION)}
_DEFAULT_RECOMPUTE = _RECOMPUTE["SelectiveAC"]
_MODEL_PACKAGE_RE = re.compile(r"torchtitan[./]models[./]([A-Za-z0-9_]+)[./]")


def is_torchtitan_py(text: str) -> bool:
    return "ParallelismConfig" in text or ".parallelism." in text


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return _Unknown(ast.unparse(node)[:60])


class _Unknown:
    def __init__(self, text: str) -> None:
        self.text = text


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        return _call_name(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_call_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


class _Reader(ast.NodeVisitor):
    """Settings one function sets, with the line of each."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[str, Any, int]] = {}  # "section.key" -> (.., value, line)
        self.flavor: str | None = None
        self.recompute: tuple[Any, Any] | None = None  # torchtitan's (mode, option)
        self.calls: set[str] = set()
        self.compile_locals: dict[str, ast.Call] = {}  # name = CompileConfig(...)
        # quantisation converters built here: (class, literal keywords, line)
        self.converters: list[tuple[str, dict[str, Any], int]] = []

    def _compile(self, node: ast.AST) -> None:
        """``compile=`` / ``config.compile =`` a ``CompileConfig(...)`` (or a local name bound
        to one): its enable and components, with CompileConfig's defaults for those unset."""
        if isinstance(node, ast.Name):
            node = self.compile_locals.get(node.id, node)
        if not (isinstance(node, ast.Call) and _call_name(node).endswith("CompileConfig")):
            return
        given = {k.arg: k.value for k in node.keywords if k.arg}
        for key, default in (("enable", False), ("components", list(COMPILE_COMPONENTS))):
            value = _literal(given[key]) if key in given else default
            self.values[f"compile.{key}"] = ("compile", value, node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node)
        self.calls.add(name.rsplit(".", 1)[-1])
        parts = name.split(".")
        if len(parts) >= 2 and parts[-1] == "Config" and parts[-2] in torchtitan.CONVERTER_KINDS:
            self.converters.append((parts[-2], {k.arg: _literal(k.value) for k in node.keywords
                                                if k.arg}, node.lineno))
        section = {"ParallelismConfig": "parallelism", "TrainingConfig": "training"}.get(
            name.rsplit(".", 1)[-1])
        if section:
            for keyword in node.keywords:
                if keyword.arg:
                    self.values[f"{section}.{keyword.arg}"] = (
                        section, _literal(keyword.value), keyword.value.lineno)
        if name.endswith("model_registry") and node.args and isinstance(
                node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            self.flavor = node.args[0].value
        for keyword in node.keywords:
            if keyword.arg == "activation_checkpoint":
                self.recompute = _recompute(keyword.value)
            if keyword.arg == "compile" and name.endswith("Config"):
                self._compile(keyword.value)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute):
                section = target.value.attr
                if section in ("parallelism", "training", "compile"):
                    self.values[f"{section}.{target.attr}"] = (
                        section, _literal(node.value), node.lineno)
            if isinstance(target, ast.Attribute) and target.attr == "activation_checkpoint":
                self.recompute = _recompute(node.value)
            if isinstance(target, ast.Attribute) and target.attr == "compile":
                self._compile(node.value)
            if (isinstance(target, ast.Name) and isinstance(node.value, ast.Call)
                    and _call_name(node.value).endswith("CompileConfig")):
                self.compile_locals[target.id] = node.value
        self.generic_visit(node)


def _recompute(node: ast.AST) -> tuple[Any, Any]:
    """``activation_checkpoint=`` as torchtitan's (mode, selective_ac_option): None; a 0.3
    class's ``Config()``; a config built with ``mode=`` / ``selective_ac_option=`` keywords
    (the 0.2 fields, as some forks write them); any other call as SelectiveAC, 0.3's default
    and the class to subclass for another save list."""
    if isinstance(node, ast.Constant) and node.value is None:
        return ("none", DEFAULT_AC_OPTION)
    given = {k.arg: k.value for k in node.keywords if k.arg} if isinstance(
        node, ast.Call) else {}
    if "mode" in given:
        mode = _literal(given["mode"])
        option = _literal(given["selective_ac_option"]) if "selective_ac_option" in given \
            else DEFAULT_AC_OPTION
        return mode, option
    name = _call_name(node).split(".")
    return next((_RECOMPUTE[part] for part in name if part in _RECOMPUTE), _DEFAULT_RECOMPUTE)


def parse_torchtitan_py(path: Path, text: str) -> list[ParsedConfig]:
    """One config per function that sets parallelism (a registry holds many)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise PlacerError(f"{path}: not valid Python ({exc.__class__.__name__})") from None
    package = _MODEL_PACKAGE_RE.search(str(path).replace("\\", "/") + "/")
    base = _base(tree)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    readers: dict[str, _Reader] = {}
    for name, function in functions.items():
        reader = _Reader()
        reader.visit(function)
        readers[name] = reader
    configs = []
    for name, reader in readers.items():
        returns = ast.unparse(functions[name].returns) if functions[name].returns else ""
        if not any(k.startswith("parallelism.") for k in reader.values) and \
                not returns.endswith("Config"):
            continue
        # a config that only adjusts another one (config = llama3_8b(); config.x = ...) or
        # placer's apply(config): start from what the called function sets
        merged = _Reader()
        for called in sorted(reader.calls & set(readers) - {name}):
            merged.values.update(readers[called].values)
            merged.flavor = merged.flavor or readers[called].flavor
            merged.recompute = merged.recompute or readers[called].recompute
            merged.converters = merged.converters or readers[called].converters
        merged.values.update(reader.values)
        merged.flavor = reader.flavor or merged.flavor
        merged.recompute = reader.recompute or merged.recompute
        merged.converters = reader.converters or merged.converters
        model_name = package.group(1) if package else _model_of_function(name)
        if base is not None:
            model_name, merged.flavor = base
        configs.append(_parsed(path, name, merged, model_name))
    return configs


# torchtitan/models/*: a registry's config functions are named <model>_<variant>
_MODELS = ("deepseek_v3", "gpt_oss", "kimi_k2_7", "llama2", "llama3", "llama4", "qwen3_5",
           "qwen3")


def _model_of_function(name: str) -> str | None:
    return next((m for m in _MODELS if name.startswith(m + "_")), None)


def _base(tree: ast.Module) -> tuple[str, str] | None:
    """(model, flavor) of ``BASE = 'torchtitan.models.llama3.config_registry:llama3_70b'``."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BASE"
                                                 for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            module, _, function = node.value.value.partition(":")
            match = _MODEL_PACKAGE_RE.search(module + ".")
            if match and function.startswith(match.group(1) + "_"):
                return match.group(1), function[len(match.group(1)) + 1:]
    return None


def _parsed(path: Path, name: str, reader: _Reader, model_name: str | None) -> ParsedConfig:
    parsed = ParsedConfig(path=str(path), kind="torchtitan", order=parse_order(TORCHTITAN_ORDER),
                          label=name)
    s = Settings()
    values = reader.values

    def number(key: str, default: int) -> int | None:
        if key not in values:
            return default
        value = values[key][1]
        if isinstance(value, bool) or not isinstance(value, int):
            why = value.text if isinstance(value, _Unknown) else repr(value)
            parsed.unresolved[key.split(".")[1]] = (f"line {values[key][2]}: {key} = {why} is "
                                                    "not a literal integer")
            return None
        return value

    for key, dim in torchtitan.DEGREES.items():
        value = number(f"parallelism.{key}", 1)
        if value is not None:
            if value < 1:
                raise PlacerError(f"{path}: {name}: parallelism.{key} = {value} must be >= 1")
            setattr(s, dim, value)
        if f"parallelism.{key}" in values:
            parsed.lines[dim] = values[f"parallelism.{key}"][2]
    replicate = number(f"parallelism.{torchtitan.REPLICATE_KEY}", 1) or 1
    shard = number(f"parallelism.{torchtitan.SHARD_KEY}", -1) or -1
    if shard == -1:
        s.dp_replicate = replicate
    else:
        s.dp = replicate * shard
    for key in (torchtitan.SHARD_KEY, torchtitan.REPLICATE_KEY):
        if f"parallelism.{key}" in values:
            parsed.lines.setdefault("dp", values[f"parallelism.{key}"][2])
    s.zero_stage = fsdp_zero_stage(shard, s.cp)
    if f"parallelism.{RESHARD_KEY}" in values:
        _, policy, line = values[f"parallelism.{RESHARD_KEY}"]
        parsed.lines["reshard_after_forward"] = line
        if isinstance(policy, _Unknown) and s.zero_stage >= 3:
            parsed.notes.append(f"parallelism.{RESHARD_KEY} = {policy.text} is not a literal: "
                                "checked as 'default'")
        elif not isinstance(policy, _Unknown):
            read_reshard(s, parsed, policy, "parallelism")
    s.sequence_parallel = s.tp > 1 and values.get("parallelism.enable_sequence_parallel",
                                                  ("", True, 0))[1] is not False
    local = values.get("training.local_batch_size", ("", None, 0))[1]
    if isinstance(local, int) and local > 0:
        s.local_batch_size = local
    per_stage = values.get("parallelism.pipeline_parallel_layers_per_stage", ("", None, 0))[1]
    if isinstance(per_stage, int) and per_stage > 0 and s.pp > 1:
        s.layers_per_virtual_stage = per_stage  # torchtitan: virtual stages of N layers
    micro = values.get("parallelism.pipeline_parallel_microbatch_size", ("", 1, 0))[1]
    s.micro_batch_size = (micro if s.pp > 1 else local) if isinstance(
        micro if s.pp > 1 else local, int) else None
    s.compile_components = _compiled(values, parsed)
    mode, option = reader.recompute or _DEFAULT_RECOMPUTE
    unknown = next((v for v in (mode, option) if isinstance(v, _Unknown)), None)
    if unknown is not None:
        parsed.notes.append(f"activation checkpointing: {unknown.text} is not a literal: "
                            "checked as SelectiveAC, op-level selective checkpointing")
        mode, option = _DEFAULT_RECOMPUTE
    read_recompute(s, parsed, mode, option)
    if reader.converters:
        parsed.lines["fp8_recipe"] = reader.converters[0][2]
        float8 = next((kw for cls, kw, _ in reader.converters
                       if torchtitan.CONVERTER_KINDS[cls] == "float8" and "recipe_name" in kw), {})
        if isinstance(float8.get("recipe_name"), _Unknown):
            parsed.notes.append(f"float8 recipe_name = {float8['recipe_name'].text} is not a "
                                "literal: checked as rowwise, 0.3's default")
            float8 = {}
        read_fp8(s, parsed, [cls for cls, _, _ in reader.converters], float8,
                 torchtitan.DEFAULT_FP8_RECIPE["0.3"])
    s.stack = torchtitan_stack(parsed, python_config=True)
    parsed.settings = s
    seq = values.get("training.seq_len", values.get("training.max_context_length",
                                                     ("", None, 0)))[1]
    parsed.seq_len = seq if isinstance(seq, int) and seq > 0 else None
    gbs = values.get("training.global_batch_size", ("", None, 0))[1]
    parsed.global_batch_size = gbs if isinstance(gbs, int) and gbs > 0 else None
    parsed.model_ref = preset_for({"name": model_name or "", "flavor": reader.flavor or ""})
    if parsed.model_ref is None:
        parsed.model = flavor_model(model_name or "", reader.flavor or "")
    if parsed.model_ref is None and parsed.model is None:
        parsed.model_problem = (f"torchtitan model {model_name!r} flavor {reader.flavor!r} is "
                                "not a model placer knows")
    else:
        parsed.notes.append(f"model from torchtitan {model_name} {reader.flavor}: "
                            f"{parsed.model_ref or 'torchtitan flavor table'}")
    return parsed


def _compiled(values: dict[str, tuple[str, Any, int]], parsed: ParsedConfig) -> tuple[str, ...]:
    """What the config torch.compiles: ``compile.enable`` and ``compile.components``
    (CompileConfig, off by default; a base config's own setting when the function leaves it).
    A value that is not a literal is read as off, with a note."""
    if "compile.enable" not in values:
        return ()
    parsed.lines["torch_compile"] = values["compile.enable"][2]
    enable = values["compile.enable"][1]
    components = values.get("compile.components", ("", list(COMPILE_COMPONENTS), 0))[1]
    for key, value in (("enable", enable), ("components", components)):
        if isinstance(value, _Unknown):
            parsed.notes.append(f"torch.compile: compile.{key} = {value.text} is not a literal: "
                                "checked uncompiled")
            return ()
    if enable is not True or not isinstance(components, list | tuple):
        return ()
    return tuple(c for c in COMPILE_COMPONENTS if c in components)
