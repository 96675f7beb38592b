"""Shared pydantic base for every placer input and output model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Floors for hardware figures, far below any real part (GPUs run 1e13-1e16 FLOP/s, links move
# 1e9-1e12 bytes/s): a positive but absurd figure such as 1e-300 made the cost model's times
# overflow to infinity. Above them every time the cost model derives stays finite.
MIN_FLOPS = 1e9
MIN_BYTES_PER_S = 1e3
MIN_EFFICIENCY = 1e-6


class Spec(BaseModel):
    """Strict model: unknown fields are errors (a misspelled key must not be ignored silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Output(BaseModel):
    """Output model: strict too, so the JSON schema documents exactly what is written."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
