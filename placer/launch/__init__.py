"""Launch artifacts from a plan: rank map, placer_mesh runtime, NCCL env, torchrun/Slurm/Kubeflow
launchers and Megatron/torchtitan/DeepSpeed configs, written all-or-nothing.

``write_launch_files`` is the one entry point; ``placer launch`` and ``recommend-layout --emit``
both call it.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DEFAULT_MASTER_PORT", "DEFAULT_SCRIPT", "LaunchBundle", "PlacedCandidate", "StackPrice",
    "launch_bundle", "render_bundle", "launch_files",
    "placement_of", "require_nccl_gpus", "write_files",
    "placer_mesh_source", "rankmap_document", "write_launch_files",
]


def __getattr__(name: str) -> Any:
    """The names above load from ``bundle`` on first use (PEP 562): importing one submodule
    (``recommend-layout`` reads ``scripts``' defaults and ``shell``'s checks on every run) does
    not import every framework dialect and writer (0.1-0.3 s measured)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("placer.launch.bundle"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
