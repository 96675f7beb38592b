"""Shared pydantic base for every placer input and output model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Strict model: unknown fields are errors (a misspelled key must not be ignored silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Output(BaseModel):
    """Output model: strict too, so the JSON schema documents exactly what is written."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
