"""Link profile: measured latency and bandwidth per link class, and achieved GEMM efficiency.

The calibration command writes one of these from real collectives on the user's cluster; the cost
model then uses it in place of its preset constants. Every figure is what nccl-tests calls *bus
bandwidth* (docs/sources.md section 4): the per-rank rate an algorithm moves data at, so that
``time = latency + bytes x factor / bandwidth`` with the nccl-tests factor of the collective
(all-reduce ``2(n-1)/n``; all-gather, reduce-scatter and all-to-all ``(n-1)/n``; send/recv 1).

A file looks like::

    format: placer-link-profile/1
    cluster: dgx-h100            # informative: where it was measured
    intra_node:                  # NVLink (or PCIe) inside a node / NVLink domain
      latency_s: 5.0e-6
      bandwidth_bytes_per_s: 3.6e11
      collectives:               # optional per-collective overrides
        all_reduce: {latency_s: 8.0e-6, bandwidth_bytes_per_s: 4.8e11}
    inter_node:                  # the network, per GPU
      latency_s: 1.2e-5
      bandwidth_bytes_per_s: 4.6e10
    gemm:                        # optional achieved compute efficiency
      max_efficiency: 0.62
    memory:                      # optional, fitted from verify --real-model peaks
      activation_scale: 1.09
      overhead_bytes: 1500000
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from placer.errors import PlacerError
from placer.spec.base import MIN_BYTES_PER_S, MIN_EFFICIENCY, Spec

PROFILE_FORMAT = "placer-link-profile/1"
CollectiveName = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
COLLECTIVE_NAMES: tuple[str, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv",
)


class LinkMeasurement(Spec):
    """One measured (latency, bus bandwidth) pair."""

    latency_s: float = Field(ge=0, le=1.0, description="per-step (per-hop) latency, seconds")
    bandwidth_bytes_per_s: float = Field(
        ge=MIN_BYTES_PER_S, le=1e14,
        description="bus bandwidth per GPU (nccl-tests busbw), bytes/s"
    )


class LinkClassProfile(LinkMeasurement):
    """A link class: its default measurement and optional per-collective overrides."""

    collectives: dict[CollectiveName, LinkMeasurement] = Field(
        default_factory=dict, description="replace the default for one collective"
    )

    def for_collective(self, name: str) -> LinkMeasurement:
        """The measurement to use for ``name`` (its override, else the class default)."""
        return self.collectives.get(name, self)  # type: ignore[call-overload,no-any-return]


class GemmProfile(Spec):
    """Achieved matrix-multiply efficiency (fraction of the dense peak) on this GPU type.

    Efficiency of one GEMM of F FLOPs is ``max_efficiency x F / (F + half_efficiency_flops)``:
    large GEMMs approach ``max_efficiency``; one of ``half_efficiency_flops`` gets half of it.
    """

    max_efficiency: float = Field(ge=MIN_EFFICIENCY, le=1.0,
                                  description="large BF16 GEMMs, fraction of peak")
    fp8_max_efficiency: float | None = Field(
        default=None, ge=MIN_EFFICIENCY, le=1.0,
        description="large FP8 GEMMs, fraction of the FP8 peak"
    )
    half_efficiency_flops: float | None = Field(
        default=None, ge=0, le=1e16, description="GEMM size (FLOPs) that reaches half of the max"
    )
    attention_efficiency: float | None = Field(
        default=None, ge=MIN_EFFICIENCY, le=1.0,
        description="fused (flash) attention, fraction of BF16 peak"
    )
    moe_dispatch_s_per_routed_token: float | None = Field(
        default=None, ge=0, le=1e-3,
        description="MoE token dispatcher time per routed token copy per pass, seconds"
    )


class MemoryProfile(Spec):
    """Peak-memory terms fitted from measured runs of real models (``placer calibrate
    --real-model``), over all measured candidates at once, never per candidate.

    The memory model counts weights, gradients and optimizer state exactly; what it estimates is
    the dynamic part (activations saved for backward, logits and loss buffers, MoE buffers,
    ZeRO-3 gathers). A measured peak is modelled as
    ``static + activation_scale x dynamic + overhead_bytes``: the scale takes what the per-token
    activation count misses in this run environment (saved temporaries, allocator rounding), the
    overhead the live bytes a rank holds beyond the model's tensors (inputs, the loss, optimizer
    temporaries, communication buffers the framework allocates).
    """

    activation_scale: float = Field(
        ge=0.1, le=10.0, description="measured / predicted dynamic memory (activations, logits, "
        "buffers, ZeRO-3 gathers)")
    overhead_bytes: int = Field(
        default=0, ge=0, le=2**40, description="live bytes per rank beyond the model's tensors")
    device: str | None = Field(default=None, max_length=16,
                               description="where the peaks were measured: cuda or cpu")
    fitted_candidates: int | None = Field(default=None, ge=1,
                                          description="measured runs the terms were fitted over")


class LinkProfile(Spec):
    """Measured link and compute figures for one cluster (``--profile FILE``)."""

    format: Literal["placer-link-profile/1"] = PROFILE_FORMAT
    cluster: str | None = Field(default=None, max_length=64, description="where it was measured")
    gpu: str | None = Field(default=None, max_length=64, description="GPU type it was measured on")
    intra_node: LinkClassProfile | None = Field(
        default=None, description="NVLink / PCIe inside a node or NVLink domain"
    )
    inter_node: LinkClassProfile | None = Field(default=None, description="the network, per GPU")
    gemm: GemmProfile | None = None
    memory: MemoryProfile | None = Field(
        default=None, description="peak-memory terms fitted from real-model runs")


def load_link_profile(path: Path) -> LinkProfile:
    """Read a YAML or JSON link profile; any problem is a one-line PlacerError."""
    from placer.spec.presets import read_document, validated

    data = read_document(path)
    if not isinstance(data, dict):
        raise PlacerError(f"{path}: expected a mapping with intra_node, inter_node and gemm")
    return validated(LinkProfile, data, str(path))
