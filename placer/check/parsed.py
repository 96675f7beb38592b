"""What a parser hands to the rules: the settings of one config, with the line each came from.

Parsers only read; they do not validate degrees (``placer.spec.layout.layout_problem`` does, in
the rules), so a config with impossible degrees still parses and gets a finding, not exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from placer.cost.deepspeed_optimizer import Wrapper
from placer.dims import DEFAULT_ORDER
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.model import Model
from placer.spec.results import RankEntry
from placer.spec.runtime import Fp8Recipe

ConfigKind = Literal["megatron", "megatron-deepspeed", "torchtitan", "deepspeed", "gpt-neox",
                     "nemo", "plan", "layout", "other"]
Recompute = Literal["none", "selective", "op", "full"]
# a framework's recompute setting, spelled as text, as the typed value
RECOMPUTE_MODES: dict[str, Recompute] = {"none": "none", "selective": "selective",
                                         "full": "full"}

# Setting keys are Layout field names; these are the ones a config may leave out (dp is then
# whatever the world size leaves, as Megatron and torchtitan derive it).
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch_size", "zero_stage",
               "recompute", "sequence_parallel", "first_stage_layers", "last_stage_layers",
               "pp_layout", "stage_layers", "recompute_layers", "recompute_modules",
               "offload_layers",
               "embedding_in_split", "loss_in_split", "reshard_after_forward")

# unresolved keys that only decide the world size (checked without it: world-size-unknown)
WORLD_KEYS = ("world", "nnodes", "nproc_per_node")


FP4_AS_FP8 = ("priced as FP8 (placer's jobs have no FP4 recipe; FP4 operands take less memory "
              "and time than priced)")
"""How check prices an NVFP4 recipe (Megatron --fp4-format, Bridge's nvfp4 mixed precision,
torchtitan's NVFP4 converter)."""


@dataclass
class Settings:
    """The parallel, memory and precision settings one config gives.

    Names are Layout's where the meaning is the same. None means the config leaves it to the
    framework: dp to what the world size leaves, vpp to 1, etp to Megatron's default (tp).
    """

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    vpp: int | None = None
    micro_batch_size: int | None = None
    zero_stage: int = 0
    recompute: Recompute = "none"
    sequence_parallel: bool = False
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    pp_layout: str | None = None
    stage_layers: tuple[int, ...] | None = None
    recompute_layers: int | None = None
    recompute_modules: tuple[str, ...] | None = None
    recompute_every: int | None = None
    """torchtitan's layer-level selective checkpointing (``selective_ac_option = "N"``, releases
    up to 0.2): every Nth block of a rank recomputed whole, the others kept (recompute full);
    the layers it makes per stage are known with the model (check.resolve)."""
    offload_layers: int = 0
    embedding_in_split: bool = False
    loss_in_split: bool = False
    reshard_after_forward: bool | None = None
    """ZeRO-3/FSDP frees gathered parameters after each forward (torchtitan's
    fsdp_reshard_after_forward: "always" True, "never" False); None: the framework's default,
    on without pipelining and off under it (Layout.reshards_after_forward)."""
    # what only check needs
    dp_replicate: int | None = None
    """torchtitan data_parallel_replicate_degree when dp_shard = -1 (dp then derived)."""
    layers_per_virtual_stage: int | None = None
    local_batch_size: int | None = None
    partition_method: str | None = None
    """DeepSpeed's pipeline partitioning (``type:transformer|embedding``, ``uniform``,
    ``parameters``); None: Megatron's even split of the layers."""
    precision: Literal["bf16", "fp8"] = "bf16"
    fp8_recipe: Fp8Recipe | None = None
    """The FP8 recipe under FP8 (runtime.fp8_recipe): Megatron's --fp8-recipe, Bridge's
    mixed_precision recipe, torchtitan's float8/mx converter; None: not given (Megatron's
    default, delayed scaling) or a recipe placer does not model (custom, NVFP4)."""
    fp8_param_gather: bool = False
    grad_reduce_bf16: bool = False
    optimizer_offload: bool = False
    deepspeed_optimizer: Wrapper | None = None
    """The optimizer wrapper DeepSpeed's engine runs for the config (placer.cost.
    deepspeed_optimizer); its memory flags price the check's memory. None: not DeepSpeed, or
    its precision is left to the launcher ("auto")."""
    zero3_max_live_params: float | None = None
    """DeepSpeed ZeRO-3's ``stage3_max_live_parameters`` (CostOptions.zero3_max_live_params)."""
    cross_entropy_impl: Literal["native", "te"] = "native"
    """Megatron's fused cross-entropy kernel (--cross-entropy-loss-fusion with
    --cross-entropy-fusion-impl te keeps the bf16 logits: memory.TE_LOSS_PEAK_BYTES_PER_ENTRY)."""
    compile_components: tuple[str, ...] = ()
    """What the config torch.compiles, in torchtitan's names (``model``: each block, ``loss``);
    any: the checked job's runtime.torch_compile, priced per component (CostOptions.
    compiled_layers, compiled_loss)."""
    stack: str | None = None
    """The stack preset the config's framework runs (placer.spec.stack): its defaults price the
    memory (eager modules or fused kernels, attention kernel, FSDP's master). None: placer's
    generic defaults, Megatron's fused kernels."""
    expandable_segments: bool | None = False
    """The launch script's environment runs PyTorch's allocator with expandable segments
    (placer.spec.runtime.alloc_conf_expandable): no fragmentation allowance in its memory; None:
    an argument file whose launcher decides."""

    def layout_values(self) -> dict[str, object]:
        """The Layout fields the config set (so the rest keep Layout's defaults)."""
        defaults = Settings()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in LAYOUT_KEYS and getattr(self, f.name) is not None
                and (getattr(self, f.name) != getattr(defaults, f.name) or f.name in
                     ("tp", "pp", "cp"))}


@dataclass(frozen=True)
class PlanCandidate:
    """One candidate of a placer plan: its layout, rank order and explicit rank map."""

    index: int
    settings: dict[str, object]
    order: tuple[str, ...]
    rank_map: tuple[RankEntry, ...]


@dataclass
class ParsedConfig:
    """Settings read from one config file, before any cluster or model is applied."""

    path: str
    kind: ConfigKind
    settings: Settings = field(default_factory=Settings)
    lines: dict[str, int] = field(default_factory=dict)
    order: tuple[str, ...] = DEFAULT_ORDER
    world_size: int | None = None
    nproc_per_node: int | None = None
    model: Model | None = None
    model_ref: str | None = None
    seq_len: int | None = None
    global_batch_size: int | None = None
    cluster: Cluster | None = None
    job: Job | None = None
    candidates: list[PlanCandidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (rule id, setting key, message) for problems a parser sees that no later rule can
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    recognised: bool = True
    label: str | None = None
    """The config's name inside a file that holds several (a torchtitan config function)."""
    # setting key -> why its value is known only when the job runs (checks needing it skipped)
    unresolved: dict[str, str] = field(default_factory=dict)
    model_problem: str | None = None
    """Why the file's model could not be read (an unknown torchtitan flavor, missing flags)."""
    nodes: int | None = None
    """Nodes the file names when it does not say the processes per node (those are then one per
    GPU of the cluster's nodes)."""
    world_source: str | None = None
    """Where the world size came from (for the summary's notes)."""

    def line_of(self, *keys: str) -> int | None:
        """Line of the first of ``keys`` the config set explicitly."""
        for key in keys:
            if key in self.lines:
                return self.lines[key]
        return None
