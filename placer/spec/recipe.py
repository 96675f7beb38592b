"""Published training recipes: a framework's own tuned layout for a model on a GPU count.

The rows live in ``presets/recipes/*.yaml`` (shipped with the package: the baseline of every
recommendation reads them), each with its source. bench/recipes.py checks placer against them.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

from pydantic import Field

from placer.spec.base import Spec
from placer.spec.layout import Layout
from placer.spec.runtime import Runtime


class RecipeSource(Spec):
    """Where a recipe was published: a URL and, for repositories, the file read."""

    url: str = Field(min_length=8)
    repo: str | None = None
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")
    path: str | None = None
    locator: str = Field(min_length=1, description="the table, row or section read")


class Measured(Spec):
    """What the source measured (any of them; ``None`` where it does not say)."""

    tokens_per_s_per_gpu: float | None = Field(default=None, gt=0)
    model_tflops_per_gpu: float | None = Field(default=None, gt=0)
    mfu: float | None = Field(default=None, gt=0, lt=1)
    peak_memory_gib: float | None = Field(default=None, gt=0)


class Recipe(Spec):
    """One published recipe: model, GPUs, batch, sequence, precision, layout, measurement."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    stack: str = Field(min_length=1, description="framework family that ran it")
    model: str = Field(description="model preset name")
    cluster: str = Field(description="cluster preset (or a cluster bench/recipes.py builds)")
    num_gpus: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    global_batch_size: int = Field(ge=1, description="sequences per step")
    precision: Literal["bf16", "fp8"]
    layout: str = Field(description="compact layout, as --layout takes it")
    measured: Measured
    runtime: Runtime = Field(
        default_factory=Runtime,
        description="framework flags the recipe's source sets beyond the layout (grad reduce "
        "dtype, FP8 parameter gather, forced-balanced MoE routing); cited in its source")
    source: RecipeSource
    note: str = ""

    def parsed_layout(self) -> Layout:
        return Layout.parse(self.layout, num_gpus=self.num_gpus)


@cache
def published_recipes() -> tuple[Recipe, ...]:
    """Every shipped recipe, in file and row order."""
    from placer.spec.presets import load_preset_yaml, validated

    folder = resources.files("placer.spec").joinpath("presets", "recipes")
    rows: list[Recipe] = []
    for entry in sorted((p for p in folder.iterdir() if p.name.endswith(".yaml")),
                        key=lambda p: p.name):
        for index, data in enumerate(load_preset_yaml(entry.read_text(encoding="utf-8"))):
            rows.append(validated(Recipe, data, f"recipes/{entry.name}[{index}]"))
    return tuple(rows)
