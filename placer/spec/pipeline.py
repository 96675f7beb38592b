"""Pipeline splits and schedules: which decoder layers each virtual stage holds, and how the
micro-batches are ordered.

A split is the decoder-layer count of each of the ``pp x vpp`` virtual stages in model order.
Stage ``c`` runs on rank ``c % pp`` (Megatron's and torchtitan's looped placement), or, for the
V-shaped schedules (ZB-V, DualPipeV), on rank ``c`` for ``c < pp`` and ``2pp - 1 - c`` after.

Four ways to state it, each with the framework's own rules:

- even: ``pp x vpp`` divides the layers;
- Megatron ``--decoder-first/last-pipeline-num-layers`` (``first=``, ``last=``): the rest split
  evenly over the middle ranks; with VPP every rank's count divisible by ``vpp``
  (megatron/core/transformer/transformer_config.py, ``num_layers_in_first_pipeline_stage``
  checks; NVIDIA/Megatron-LM@d98e8a6);
- Megatron ``--account-for-embedding/loss-in-pipeline-split`` (``emb=on``, ``loss=on``): the
  embedding and the loss count as one layer each, ``num_layers + emb + loss`` divisible by ``pp``
  and the per-rank count by ``vpp``; the first (last) virtual stage builds one decoder layer fewer
  (transformer_block.py ``get_num_layers_to_build``); refused together with first/last;
- an explicit list: Megatron ``--pipeline-model-parallel-layout`` (``pplayout=Et|(tt|)*30,L``:
  ``E`` embedding, ``t`` decoder layer, ``L`` loss, ``|`` between virtual stages, ``(..)*n`` and
  ``x*n`` repeats, commas cosmetic; pipeline_parallel_layer_layout.py ``parse_str_to_list`` and
  ``validate_layer_layout``), or per-stage counts (``stages=1/2/2/...``, torchtitan's
  ``module_fqns_per_model_part``).

Without any of them an uneven split with VPP counts the embedding and loss as layers (Megatron's
recipe for 126- and 94-layer models) when that divides, else spreads the virtual stages as evenly
as possible with those two counted (61-layer DeepSeek-V3 and Kimi-K2 on PP4 VPP4 or PP8 VPP4);
without VPP it keeps the first and last ranks lightest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # placer.spec.layout imports this module
    from placer.spec.layout import Layout

Schedule = Literal["1f1b", "interleaved", "gpipe", "zb1p", "zbv", "dualpipe", "dualpipev"]
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "gpipe", "zb1p", "zbv", "dualpipe",
                              "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")
"""Two virtual stages per rank in a V (torch.distributed.pipelining ScheduleZBVZeroBubble and
ScheduleDualPipeV require exactly 2 stages per rank)."""

Problem = tuple[str, object, str]

_LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


@dataclass(frozen=True)
class PipelineSplit:
    """Decoder layers of every virtual stage, where each runs, and how the ends are counted."""

    chunks: tuple[int, ...]
    pp: int
    v_shape: bool = False
    embedding_in_split: bool = False
    loss_in_split: bool = False

    @property
    def vpp(self) -> int:
        return len(self.chunks) // self.pp

    def rank_of(self, chunk: int) -> int:
        """The pipeline rank that runs virtual stage ``chunk``."""
        if self.v_shape:
            return chunk if chunk < self.pp else 2 * self.pp - 1 - chunk
        return chunk % self.pp

    @property
    def rank_layers(self) -> list[int]:
        """Decoder layers each rank holds."""
        return list(self._rank_layers)

    @cached_property
    def _rank_layers(self) -> tuple[int, ...]:
        # Counted once per split: the search asks every layout it filters (resolve_split hands
        # out the same split for the same arguments).
        out = [0] * self.pp
        for chunk, size in enumerate(self.chunks):
            out[self.rank_of(chunk)] += size
        return tuple(out)

    @property
    def megatron_layout(self) -> str:
        """The split as Megatron's ``--pipeline-model-parallel-layout`` string (any split)."""
        stages = ["t" * n for n in self.chunks]
        stages[0] = "E" + stages[0]
        stages[-1] = stages[-1] + "L"
        return "|".join(_compress(s) for s in stages)


def _compress(stage: str) -> str:
    """``Ettt`` -> ``Et*3``: Megatron's ``x*n`` repeat for long runs of decoder layers."""
    return re.sub(r"t{3,}", lambda m: f"t*{len(m.group(0))}", stage)


def parse_megatron_layout(text: str) -> list[list[str]] | str:
    """Megatron's layout string as layer names per virtual stage; a message when malformed.

    Same grammar as ``PipelineParallelLayerLayout.parse_str_to_list``: commas are removed,
    ``(...)*n`` then ``x*n`` are unrolled, ``|`` separates stages.
    """
    flat = text.replace(",", "").strip()
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        flat = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), flat)
    stages: list[list[str]] = []
    for stage in flat.split("|"):
        names = []
        for char in stage:
            if char not in _LAYOUT_CHARS:
                return (f"unknown layer character {char!r}; use E (embedding), t (decoder "
                        "layer), L (loss), | between stages, (..)*n to repeat")
            names.append(_LAYOUT_CHARS[char])
        stages.append(names)
    return stages


def _from_megatron_layout(text: str, num_layers: int, pp: int, vpp: int) -> PipelineSplit | Problem:
    field = "layout.pp_layout"
    stages = parse_megatron_layout(text)
    if isinstance(stages, str):
        return (field, text, stages)
    if len(stages) % pp:
        return (field, text, f"its {len(stages)} stages must be a multiple of pp={pp} "
                "(Megatron: pipeline_model_parallel_layout must be divisible by pp)")
    if len(stages) // pp != vpp:
        return (field, text, f"{len(stages)} stages on pp={pp} mean vpp={len(stages) // pp}; "
                f"set vpp={len(stages) // pp}")
    flat = [name for stage in stages for name in stage]
    if not flat or flat[0] != "embedding" or flat[-1] != "loss":
        return (field, text, "the first layer must be E (embedding) and the last L (loss)")
    if flat.count("embedding") != 1 or flat.count("loss") != 1:
        return (field, text, "E and L each appear exactly once")
    if "mtp" in flat:
        return (field, text, "the model has no multi-token-prediction layers; drop 'm'")
    decoders = tuple(stage.count("decoder") for stage in stages)
    if sum(decoders) != num_layers:
        return (field, text, f"it places {sum(decoders)} decoder layers (t); the model has "
                f"{num_layers}")
    return PipelineSplit(chunks=decoders, pp=pp)


def _from_counts(counts: tuple[int, ...], num_layers: int, pp: int,
                 vpp: int) -> PipelineSplit | Problem:
    field = "layout.stage_layers"
    if len(counts) != pp * vpp:
        return (field, "/".join(map(str, counts)), f"give one count per virtual stage: "
                f"pp*vpp={pp * vpp}")
    if sum(counts) != num_layers:
        return (field, "/".join(map(str, counts)), f"counts add up to {sum(counts)}; the model "
                f"has {num_layers} layers")
    return PipelineSplit(chunks=counts, pp=pp)


def _from_first_last(num_layers: int, pp: int, vpp: int, first: int | None,
                     last: int | None) -> PipelineSplit | Problem:
    """Megatron's ``--decoder-first/last-pipeline-num-layers`` (TransformerConfig checks)."""
    rest, middle = num_layers, pp
    for name, value in (("first_stage_layers", first), ("last_stage_layers", last)):
        if value is None:
            continue
        if vpp > 1 and value % vpp:
            return (f"layout.{name}", value, f"must be divisible by vpp={vpp} (Megatron: "
                    "layers at the first/last stage must be divisible by the virtual pipeline "
                    "degree); or give the stages with pplayout=")
        rest -= value
        middle -= 1
    if rest < 0 or bool(rest) != bool(middle):
        return ("layout.first_stage_layers", first, f"{rest} layers left for {middle} middle "
                "stages (Megatron: middle layers and middle stages must both be present or not)")
    per_middle = rest // middle if middle else 0
    if middle and rest % middle:
        return ("layout.first_stage_layers", first, f"the {rest} middle layers must divide over "
                f"the {middle} middle stages")
    if middle and vpp > 1 and per_middle % vpp:
        return ("layout.first_stage_layers", first, f"{per_middle} layers per middle stage must "
                f"be divisible by vpp={vpp}")
    ranks = [per_middle] * pp
    if first is not None:
        ranks[0] = first
    if last is not None:
        ranks[-1] = last
    return _chunks_of_ranks(ranks, pp, vpp)


def _chunks_of_ranks(ranks: list[int], pp: int, vpp: int) -> PipelineSplit:
    return PipelineSplit(chunks=tuple(ranks[c % pp] // vpp for c in range(pp * vpp)), pp=pp)


def _from_ends(num_layers: int, pp: int, vpp: int, embedding: bool,
               loss: bool) -> PipelineSplit | Problem:
    """Megatron's ``--account-for-embedding/loss-in-pipeline-split``."""
    counted = num_layers + int(embedding) + int(loss)
    if counted % pp:
        return ("layout.pp", pp, f"num_layers + embedding + loss = {counted} must be divisible by "
                "pp (Megatron's account-for-embedding/loss rule)")
    per_rank = counted // pp
    if per_rank % vpp:
        return ("layout.vpp", vpp, f"{per_rank} layers per rank (embedding and loss counted) must "
                "be divisible by vpp")
    per_chunk = per_rank // vpp
    chunks = [per_chunk] * (pp * vpp)
    chunks[0] -= int(embedding)
    chunks[-1] -= int(loss)
    if min(chunks) < 0:
        return ("layout.vpp", vpp, "not enough layers in the first or last virtual stage")
    return PipelineSplit(chunks=tuple(chunks), pp=pp, embedding_in_split=embedding,
                         loss_in_split=loss)


def _auto(num_layers: int, pp: int, vpp: int) -> PipelineSplit | Problem:
    if num_layers % (pp * vpp) == 0:
        return PipelineSplit(chunks=(num_layers // (pp * vpp),) * (pp * vpp), pp=pp)
    if vpp == 1:
        if pp > num_layers:
            return ("layout.pp", pp, f"more stages than num_layers={num_layers}")
        base, extra = divmod(num_layers, pp)
        ranks = [base] * pp
        receivers = list(range(pp - 2, 0, -1)) + [pp - 1]  # middle stages, latest first; then last
        for stage in receivers[:extra]:
            ranks[stage] += 1
        return _chunks_of_ranks(ranks, pp, 1)
    ends = _from_ends(num_layers, pp, vpp, True, True)
    if isinstance(ends, PipelineSplit):
        return ends
    return _balanced(num_layers, pp, vpp)


def _balanced(num_layers: int, pp: int, vpp: int) -> PipelineSplit | Problem:
    """Virtual stages as even as possible with the embedding and the loss counted as one layer
    each, the extra layers on the middle stages (latest first): the kind of explicit layout
    Megatron-Bridge writes for DeepSeek-V3 and Kimi-K2 (recipes' ``map_pp_vp_to_layout``, e.g.
    PP4 VPP4 as ``E t*4 | (t*4 |)*14 t L``); written to Megatron as
    ``--pipeline-model-parallel-layout``."""
    chunks = pp * vpp
    if chunks > num_layers + 2:
        return ("layout.vpp", vpp, f"pp*vpp={chunks} virtual stages exceed the {num_layers} "
                "layers plus embedding and loss")
    base, extra = divmod(num_layers + 2, chunks)
    sizes = [base] * chunks
    receivers = list(range(chunks - 2, 0, -1)) + [chunks - 1, 0]
    for chunk in receivers[:extra]:
        sizes[chunk] += 1
    sizes[0] -= 1
    sizes[-1] -= 1
    if min(sizes) < 0:
        return ("layout.vpp", vpp, "too few layers for the first or last virtual stage")
    return PipelineSplit(chunks=tuple(sizes), pp=pp, embedding_in_split=True, loss_in_split=True)


@lru_cache(maxsize=16384)  # pure in its arguments; the search resolves the same split per layout
def resolve_split(num_layers: int, pp: int, vpp: int, *, first: int | None = None,
                  last: int | None = None, embedding: bool = False, loss: bool = False,
                  pp_layout: str | None = None, stage_layers: tuple[int, ...] | None = None,
                  v_shape: bool = False) -> PipelineSplit | Problem:
    """The split a layout asks for, or ``(field, value, fix)`` naming the rule it breaks."""
    explicit = [name for name, given in (("pp_layout", pp_layout is not None),
                                         ("stage_layers", stage_layers is not None),
                                         ("first_stage_layers", first is not None),
                                         ("last_stage_layers", last is not None))
                if given]
    if pp_layout is not None or stage_layers is not None:
        if len(explicit) > 1 or embedding or loss:
            return (f"layout.{explicit[0]}", pp_layout or stage_layers, "an explicit stage list "
                    "cannot be combined with first/last/emb/loss (Megatron refuses "
                    "pipeline_model_parallel_layout with other pipeline layout arguments)")
        split = (_from_megatron_layout(pp_layout, num_layers, pp, vpp) if pp_layout is not None
                 else _from_counts(stage_layers or (), num_layers, pp, vpp))
    elif first is not None or last is not None:
        if embedding or loss:
            return ("layout.first_stage_layers", first, "first/last stage layer counts cannot be "
                    "combined with emb/loss accounting (Megatron TransformerConfig refuses it)")
        split = _from_first_last(num_layers, pp, vpp, first, last)
    elif embedding or loss:
        split = _from_ends(num_layers, pp, vpp, embedding, loss)
    else:
        split = _auto(num_layers, pp, vpp)
    if isinstance(split, PipelineSplit) and v_shape:
        return PipelineSplit(split.chunks, pp, True, split.embedding_in_split, split.loss_in_split)
    return split


def schedule_problem(schedule: str, pp: int, vpp: int) -> Problem | None:
    """Whether ``schedule`` can run ``pp`` ranks of ``vpp`` virtual stages each."""
    field = "layout.schedule"
    if pp == 1:
        return None if schedule in ("1f1b", "interleaved") and vpp == 1 else (
            field, schedule, "pipeline schedules need pp > 1")
    if schedule in ("1f1b", "gpipe", "dualpipe") and vpp != 1:
        return (field, schedule, f"{schedule} runs one stage per rank; use vpp=1 or "
                "schedule=interleaved")
    if schedule == "interleaved" and vpp == 1:
        return (field, schedule, "the interleaved schedule needs vpp > 1")
    if schedule in V_SCHEDULES and vpp != 2:
        return (field, schedule, f"{schedule} places exactly 2 virtual stages per rank in a V; "
                "set vpp=2")
    if schedule == "dualpipe" and pp % 2:
        return (field, schedule, "DualPipe feeds micro-batches from both ends: pp must be even")
    return None


def default_schedule(vpp: int) -> str:
    """1F1B, or Megatron's interleaved 1F1B when there are virtual stages."""
    return "interleaved" if vpp > 1 else "1f1b"


def split_notes(layout: Layout, num_layers: int) -> list[str]:
    """One line saying how an uneven pipeline was split when the layout did not say, with the
    Megatron flags that run it (the caller's ``defaults used``)."""
    explicit = (layout.first_stage_layers, layout.last_stage_layers, layout.pp_layout,
                layout.stage_layers)
    if layout.pp == 1 or any(v is not None for v in explicit) or layout.embedding_in_split \
            or layout.loss_in_split:
        return []
    split = layout.pipeline_split(num_layers)
    if len(set(split.chunks)) == 1:
        return []
    ranks = split.rank_layers
    how = (f"layers per rank {min(ranks)}-{max(ranks)}, per virtual stage "
           f"{min(split.chunks)}-{max(split.chunks)}")
    if split.embedding_in_split and layout.vpp > 1 and (num_layers + 2) % layout.pp == 0:
        return [f"uneven pipeline: {how}, embedding and loss counted as layers "
                "(Megatron --account-for-embedding-in-pipeline-split "
                "--account-for-loss-in-pipeline-split; set emb=/loss=, first=/last= or pplayout=)"]
    return [f"uneven pipeline: {how} (Megatron --pipeline-model-parallel-layout "
            f"'{split.megatron_layout}'; set first=/last=, emb=/loss= or pplayout=)"]
