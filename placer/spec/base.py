"""Shared pydantic base for every placer input and output model."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

# Floors for hardware figures, far below any real part (GPUs run 1e13-1e16 FLOP/s, links move
# 1e9-1e12 bytes/s): a positive but absurd figure such as 1e-300 made the cost model's times
# overflow to infinity. Above them every time the cost model derives stays finite.
MIN_FLOPS = 1e9
MIN_BYTES_PER_S = 1e3
MIN_EFFICIENCY = 1e-6


def _is_number(annotation: Any) -> bool:
    """Whether a field takes a number and not a boolean (``int``, ``float | None``, ...)."""
    if get_origin(annotation) in (Union, types.UnionType):
        options = get_args(annotation)
        return bool not in options and any(_is_number(a) for a in options)
    return annotation in (int, float)


class Spec(BaseModel):
    """Strict model: unknown fields are errors (a misspelled key must not be ignored silently),
    and a boolean is not a number (pydantic would read ``num_layers: true`` as 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _is_number(field.annotation):
            raise ValueError(f"{str(value).lower()} is a boolean; expected a number")
        return value


class Output(BaseModel):
    """Output model: strict too, so the JSON schema documents exactly what is written."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
