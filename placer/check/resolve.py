"""Turn a parsed config into a placed layout on a sized cluster, and run every rule on it.

Order of decisions (each documented in the notes of the config's summary):
- cluster: the one a plan or layout file names, else ``--cluster``;
- world size: the config's (torchrun flags, WORLD_SIZE, DeepSpeed batch arithmetic, a plan's
  num_gpus), else ``--nodes`` x processes per node, else the cluster's GPU count; a single-pool
  cluster is resized to the nodes the world size needs;
- dp: what tp*pp*cp leave of the world size when the config does not set it;
- model: ``--model``, else the one the config describes;
- placement: rank r on torchrun's slot r (nodes in order, contiguous blocks), or a plan's rank map.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from placer.check.findings import ConfigSummary, Finding
from placer.check.parsed import LAYOUT_KEYS, WORLD_KEYS, ParsedConfig, PlanCandidate
from placer.check.rules import Placed, finding, group_findings
from placer.check.world import node_inputs
from placer.cost import memory_estimate
from placer.cost.deepspeed_optimizer import memory_flags
from placer.cost.stack_options import job_options
from placer.dims import DENSE_DIMS
from placer.errors import PlacerError
from placer.mesh import MeshGrid, order_text, torchrun_numbering
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout, layout_problem
from placer.spec.model import Model
from placer.spec.presets import load_model, validated
from placer.spec.profile import LinkProfile
from placer.spec.runtime import ALLOC_CONF_VARIABLES, Runtime, alloc_conf_expandable
from placer.topology import ClusterTopology, topology_of
from placer.units import GIB


@dataclass(frozen=True)
class CheckOptions:
    """What the command line adds to every config (each may be None)."""

    cluster: Cluster | None = None
    model: Model | None = None
    nodes: int | None = None
    seq_len: int | None = None
    candidate: int | None = None
    """Plans: check only this candidate (0 is the one ``placer launch`` uses); None: all."""
    env: tuple[tuple[str, str], ...] = ()
    """``--env NAME=VALUE``: variables a launch script reads from its environment."""
    profile: LinkProfile | None = None
    """``--profile``: a calibrated profile whose memory terms the memory rule uses."""

    def inputs(self) -> dict[str, str]:
        """What a launch script's environment holds: ``--nodes`` as every scheduler's node
        count variable, then ``--env`` (which wins)."""
        return {**node_inputs(self.nodes), **dict(self.env)}


class _Stop(Exception):
    """A finding after which the config cannot be placed (raised inside this module only)."""

    def __init__(self, item: Finding) -> None:
        super().__init__(item.message)
        self.finding = item


@dataclass
class _Context:
    parsed: ParsedConfig
    cluster: Cluster
    world: int
    per_node: int
    model: Model | None
    notes: list[str]
    seq_len_option: int | None = None
    world_known: bool = True
    profile: LinkProfile | None = None
    env: tuple[tuple[str, str], ...] = ()

    def stop(self, rule_id: str, message: str, *keys: str) -> _Stop:
        return _Stop(finding(rule_id, message, self.parsed.path, self.parsed.line_of(*keys)))


def check_config(parsed: ParsedConfig, options: CheckOptions) -> tuple[ConfigSummary,
                                                                          list[Finding]]:
    """Summary and findings of one parsed config (PlacerError for unusable command-line input)."""
    summary = ConfigSummary(file=parsed.path, kind=parsed.kind, notes=list(parsed.notes),
                            config=parsed.label)
    if not parsed.recognised:
        what = (parsed.notes[0] if parsed.kind == "other" and parsed.notes
                else f"no {parsed.kind} parallel settings found")
        return summary, [finding("no-parallel-settings", f"{what}; nothing checked",
                                 parsed.path)]
    findings = [finding(rule, message, parsed.path, parsed.line_of(key))
                for rule, key, message in parsed.problems]
    notes = summary.notes
    blocking = {k: v for k, v in parsed.unresolved.items() if k not in WORLD_KEYS}
    if blocking and parsed.kind != "plan":
        keys = ", ".join(sorted(blocking))
        first = blocking[sorted(blocking)[0]]
        return summary, findings + [finding(
            "setting-unresolved", f"{keys} known only when the job runs ({first}); the layout "
            "checks were skipped: pass --env NAME=VALUE for the variables it depends on",
            parsed.path, parsed.line_of(*sorted(blocking)))]
    try:
        ctx = _context(parsed, options, notes)
        if ctx.model is None:
            findings.append(finding(
                "model-unknown", f"no model in this {parsed.kind} config"
                f"{' (' + parsed.model_problem + ')' if parsed.model_problem else ''}: head, "
                "layer and expert divisibility and memory not checked; pass --model",
                parsed.path, parsed.line_of("model")))
        if not ctx.world_known:
            why = parsed.unresolved.get("world") or parsed.unresolved.get("nnodes") or \
                parsed.unresolved.get("nproc_per_node") or "the file does not say"
            findings.append(finding(
                "world-size-unknown", f"world size unknown ({why}): checked TP/CP/PP placement "
                f"and divisibility on the {ctx.world} GPUs tp*pp*cp needs; skipped: "
                "data-parallel size, world-size divisibility, EP placement, batch divisibility"
                " and memory; pass --nodes N", parsed.path, parsed.line_of("nnodes", "world")))
        summary.cluster = f"{ctx.cluster.name} x {ctx.cluster.num_nodes} nodes"
        summary.num_gpus = ctx.world if ctx.world_known else None
        summary.model = ctx.model.name if ctx.model else None
        if parsed.kind == "plan":
            candidates = _selected(parsed, options.candidate)
            notes.append("plan candidates checked: "
                         + ", ".join(str(c.index) for c in candidates))
            for candidate in candidates:
                layout = validated(Layout, candidate.settings, parsed.path)
                if candidate.index == 0:
                    summary.layout, summary.order = layout.compact(), order_text(candidate.order)
                findings += _check_candidate(ctx, layout, candidate)
        else:
            layout, early = _layout(ctx)
            findings += early
            summary.layout, summary.order = layout.compact(), order_text(parsed.order)
            findings += _check_layout(ctx, layout, None, bool(early))
    except _Stop as stop:
        findings.append(stop.finding)
    return summary, findings


def _selected(parsed: ParsedConfig, index: int | None) -> list[PlanCandidate]:
    if index is None:
        return parsed.candidates
    if not 0 <= index < len(parsed.candidates):
        raise PlacerError(f"{parsed.path}: --candidate {index}: the plan has candidates "
                          f"0..{len(parsed.candidates) - 1}")
    return [parsed.candidates[index]]


# ----- cluster, world size, model ------------------------------------------------------------


def _gpus_per_node(cluster: Cluster) -> int | None:
    """GPUs per node when every node is alike (the only case torchrun's blocks are even)."""
    return cluster.node_types[0].gpus_per_node if cluster.is_regular else None


def _context(parsed: ParsedConfig, options: CheckOptions, notes: list[str]) -> _Context:
    cluster = parsed.cluster if parsed.cluster is not None else options.cluster
    if cluster is None:
        raise PlacerError(f"{parsed.path}: pass --cluster (a preset or a cluster file); this "
                          f"{parsed.kind} config does not name one")
    if parsed.cluster is not None and options.cluster is not None:
        notes.append(f"checked on the file's own cluster {parsed.cluster.name}; --cluster "
                     "applies to configs that name none")
    model = _model(parsed, options, notes)
    gpn = _gpus_per_node(cluster)
    per_node = parsed.nproc_per_node or gpn
    world: int | None
    if parsed.world_size is not None:
        world = parsed.world_size
        if parsed.world_source:
            notes.append(f"world size {world} from the file ({parsed.world_source})")
        if options.nodes is not None and per_node and options.nodes * per_node != world:
            notes.append(f"the config runs {world} ranks; --nodes {options.nodes} ignored")
    elif options.nodes is not None and per_node:
        world = options.nodes * per_node
        notes.append(f"world size {world}: --nodes {options.nodes} x {per_node} per node")
    elif parsed.nodes is not None and per_node:
        world = parsed.nodes * per_node
        notes.append(f"world size {world}: the file's {parsed.nodes} nodes x one process per "
                     f"GPU of {cluster.name}'s nodes")
    elif parsed.settings.dp is not None:
        s = parsed.settings
        world = s.tp * s.pp * s.cp * s.dp
    else:
        world = None
    ctx = _Context(parsed, cluster, world or 0, per_node or 0, model, notes, options.seq_len,
                   world_known=world is not None, profile=options.profile, env=options.env)
    if world is None:
        s = parsed.settings
        ctx.world = s.tp * s.pp * s.cp
    ctx.cluster = _sized_cluster(ctx, gpn)
    return ctx


def _sized_cluster(ctx: _Context, gpn: int | None) -> Cluster:
    cluster, world = ctx.cluster, ctx.world
    if ctx.parsed.kind == "plan":
        # A plan's rank map names its nodes and GPUs; it may use part of its cluster.
        ctx.per_node = 0
        return cluster
    if gpn is None:
        if cluster.num_gpus != world and ctx.world_known:
            raise ctx.stop("degrees-cluster", f"the config runs {world} ranks but cluster "
                           f"{cluster.name} has {cluster.num_gpus} healthy GPUs", "world")
        ctx.per_node = 0
        return cluster
    if ctx.per_node > gpn:
        raise ctx.stop("degrees-cluster", f"the launch starts {ctx.per_node} processes per node "
                       f"but {cluster.node_types[0].name} nodes have {gpn} GPUs", "nproc_per_node")
    if ctx.parsed.nproc_per_node is None and ctx.world_known and world < ctx.per_node:
        ctx.per_node = world  # a job smaller than one node runs on part of one node
    if not ctx.world_known:
        nodes = -(-world // ctx.per_node)
        ctx.world = nodes * ctx.per_node
    elif world % ctx.per_node:
        raise ctx.stop("degrees-cluster", f"world size {world} is not a whole number of "
                       f"{ctx.per_node}-GPU nodes", "world")
    nodes = ctx.world // ctx.per_node
    if nodes == cluster.num_nodes:
        return cluster
    if len(cluster.pools) != 1:
        raise ctx.stop("degrees-cluster", f"the config needs {nodes} nodes but cluster "
                       f"{cluster.name} has {cluster.num_nodes} in several pools", "world")
    return cluster.with_nodes(nodes)


def _model(parsed: ParsedConfig, options: CheckOptions, notes: list[str]) -> Model | None:
    if options.model is not None:
        if parsed.model is not None and parsed.model != options.model:
            notes.append(f"--model {options.model.name} used instead of the model in the file")
        return options.model
    if parsed.model is not None:
        return parsed.model
    if parsed.model_ref is not None:
        return load_model(parsed.model_ref)
    return None


# ----- layout and job ------------------------------------------------------------------------


def _layout(ctx: _Context) -> tuple[Layout, list[Finding]]:
    """The config's layout with dp (and Megatron's vpp) derived; stops if it cannot exist."""
    s = ctx.parsed.settings
    values = s.layout_values()
    tp, pp, cp = s.tp, s.pp, s.cp
    inner = tp * pp * cp
    if s.dp is None:
        if ctx.world % inner:
            raise ctx.stop("degrees-cluster", f"tp*pp*cp = {tp}*{pp}*{cp} = {inner} does not "
                           f"divide the {ctx.world} GPUs", "tp", "pp", "cp")
        dp = ctx.world // inner
        if s.dp_replicate is not None and dp % s.dp_replicate:
            raise ctx.stop("degrees-cluster", f"data_parallel_replicate_degree={s.dp_replicate} "
                           f"does not divide the data-parallel size {dp}", "dp")
    elif inner * s.dp != ctx.world:
        raise ctx.stop("degrees-cluster", f"tp*pp*dp*cp = {inner * s.dp} but the job runs "
                       f"{ctx.world} ranks", "dp", "tp")
    else:
        dp = s.dp
    values["dp"] = dp
    early: list[Finding] = []
    if s.layers_per_virtual_stage is not None:
        vpp, problem = _virtual_stages(ctx.model, pp, s.layers_per_virtual_stage)
        values["vpp"] = vpp
        if problem:
            early.append(finding("degrees-model", problem, ctx.parsed.path,
                                 ctx.parsed.line_of("layers_per_virtual_stage")))
        elif ctx.model is None:
            ctx.notes.append("virtual stages unknown without the model's layer count")
    if ctx.model is not None and s.partition_method is not None and pp > 1:
        split, problem = deepspeed_partition(ctx.model.num_layers, pp, s.partition_method)
        if problem:
            early.append(finding("degrees-model", problem, ctx.parsed.path,
                                 ctx.parsed.line_of("partition_method", "pp")))
        else:
            values.update(split)
            ctx.notes.append(f"DeepSpeed pipeline partition {s.partition_method} over pp={pp}")
    elif ctx.model is not None and ctx.parsed.kind in ("megatron", "megatron-deepspeed", "nemo"):
        explicit = (s.first_stage_layers, s.last_stage_layers, s.pp_layout)
        if all(v is None for v in explicit) and not (s.embedding_in_split or s.loss_in_split):
            given = values.get("vpp")
            vpp = given if isinstance(given, int) else 1
            if ctx.model.num_layers % (pp * vpp):
                early.append(finding(
                    "degrees-model", f"pp = {pp}: Megatron needs pp*vpp={pp * vpp} to divide "
                    f"num_layers={ctx.model.num_layers} unless --decoder-first/last-pipeline-"
                    "num-layers or --pipeline-model-parallel-layout give an uneven split",
                    ctx.parsed.path, ctx.parsed.line_of("pp", "num_layers")))
    values = {k: v for k, v in values.items() if k in LAYOUT_KEYS}
    if early:  # already reported: the layout is checked with an automatic split
        for key in ("stage_layers", "first_stage_layers", "last_stage_layers", "pp_layout",
                    "embedding_in_split", "loss_in_split"):
            values.pop(key, None)
    layout = validated(Layout, values, ctx.parsed.path)
    if s.recompute_every is not None and ctx.model is not None and not early:
        layout = _every_nth_block(ctx, layout, s.recompute_every)
    return layout, early


def _every_nth_block(ctx: _Context, layout: Layout, every: int) -> Layout:
    """torchtitan's ``selective_ac_option = N`` as the layers recomputed per virtual stage:
    a rank checkpoints its blocks N, 2N, ... (one count over all the chunks it builds), so a
    rank of ``h`` layers recomputes ``h // N``; placer recomputes the same count of each
    virtual stage (Layout.recompute_layers), the smallest giving the first rank its share."""
    assert ctx.model is not None
    split = layout.pipeline_split(ctx.model.num_layers)

    def recomputed(rank: int, per_stage: int) -> int:
        return sum(min(size, per_stage) for chunk, size in enumerate(split.chunks)
                   if split.rank_of(chunk) == rank)

    held = split.rank_layers
    per_stage = next(k for k in range(max(split.chunks) + 1)
                     if recomputed(0, k) >= held[0] // every)
    exact = all(recomputed(r, per_stage) == held[r] // every for r in range(split.pp))
    ctx.notes.append(
        f"selective_ac_option = '{every}' on {ctx.model.name}: recompute=full of {per_stage} "
        "layers per virtual stage (rlayers)" + (
            "" if exact else f", exact for the first pipeline rank only (its blocks "
            f"{every}, {2 * every}, ... of {held[0]})"))
    return layout.model_copy(update={"recompute_layers": per_stage})


def deepspeed_partition(num_layers: int, pp: int, method: str
                        ) -> tuple[dict[str, object], str | None]:
    """Layout fields for DeepSpeed's PipelineModule partitioning, or the reason it cannot run.

    ``type:REGEX`` balances the layers whose class name matches (Megatron-DeepSpeed's
    GPTModelPipe: the transformer layers, and with ``embedding`` the tied EmbeddingPipe at both
    ends), each stage getting q or q+1 of them (ds_utils.partition_balanced on 0/1 weights);
    ``uniform`` and ``parameters`` are approximated by the transformer layers alone. A stage
    with nothing to hold cannot exist; a stage holding only an embedding does run (BigScience's
    BLOOMZ tr13-176B: 70 layers + 2 embeddings on 72 stages).
    """
    regex = method.split(":", 1)[1] if method.startswith("type:") else "transformer"
    try:
        embedding = re.search(regex, "EmbeddingPipe", re.IGNORECASE) is not None
        counted = re.search(regex, "ParallelTransformerLayerPipe", re.IGNORECASE) is not None
    except re.error:
        return {}, f"--pp-partition-method {method!r} is not a valid regular expression"
    if not counted:
        return {}, (f"--pp-partition-method {method}: no transformer layer matches, so DeepSpeed "
                    "cannot balance the transformer layers over the stages")
    units = num_layers + (2 if embedding else 0)
    if units < pp:
        return {}, (f"pp = {pp}: {method} balances {units} units ({num_layers} transformer "
                    f"layers{' + 2 embeddings' if embedding else ''}) over more stages than "
                    "there are units, so a stage would hold nothing")
    if embedding and units % pp == 0:
        # the embedding and the tied output layer count as one layer each at the two ends
        return {"embedding_in_split": True, "loss_in_split": True}, None
    per, extra = divmod(units, pp)
    sizes = [per + (1 if k >= pp - extra else 0) for k in range(pp)]
    if embedding:
        sizes[0] -= 1
        sizes[-1] -= 1
    return {"stage_layers": tuple(sizes)}, None


def _virtual_stages(model: Model | None, pp: int, per_stage: int) -> tuple[int, str | None]:
    """Megatron's vpp from --num-layers-per-virtual-pipeline-stage (docs/sources.md 6.3)."""
    if model is None:
        return 1, None
    per_rank, rest = divmod(model.num_layers, pp)
    if rest or per_rank % per_stage:
        return 1, (f"--num-layers-per-virtual-pipeline-stage {per_stage} must divide "
                   f"num_layers/pp = {model.num_layers}/{pp}")
    return max(1, per_rank // per_stage), None


def _job(ctx: _Context, layout: Layout) -> tuple[Job, bool]:
    """The job the checks assume, and whether its sequence length is known. Precision and the
    runtime follow the config's flags: FP8 training, FP8 parameter gather (1-byte working
    weights) and bf16 gradient reduction (2-byte main gradients), as Megatron's --fp8-format,
    --fp8-param-gather and --grad-reduce-in-bf16 do (placer.spec.runtime turns them into bytes)."""
    parsed = ctx.parsed
    if parsed.job is not None:
        return parsed.job, True
    s = parsed.settings
    seq_len = parsed.seq_len or ctx.seq_len_option
    gbs = parsed.global_batch_size
    if gbs is None or not ctx.world_known:
        local = s.local_batch_size or layout.micro_batch_size
        if gbs is None:
            ctx.notes.append("global batch not set: assumed data-parallel size x local batch = "
                             f"{layout.dp * local} (the frameworks' default)")
        gbs = layout.dp * local * (1 if ctx.world_known else layout.pp)
    if seq_len is None:
        # Any multiple of 2*cp*tp passes the sequence checks: they are skipped, not guessed.
        seq_len = 2 * layout.cp * layout.tp * 1024
        ctx.notes.append("sequence length unknown: sequence checks and memory skipped "
                         "(pass --seq-len)")
        known = False
    else:
        known = True
    runtime = Runtime(grad_reduce_dtype="bf16" if s.grad_reduce_bf16 else None,
                      fp8_param_gather=s.fp8_param_gather and s.precision == "fp8",
                      fp8_recipe=s.fp8_recipe if s.precision == "fp8" else None,
                      cross_entropy_impl="te" if s.cross_entropy_impl == "te" else None,
                      expandable_segments=_expandable_segments(ctx),
                      torch_compile=bool(s.compile_components))
    if s.compile_components:
        ctx.notes.append(f"torch.compile: {', '.join(s.compile_components)} (runtime."
                         "torch_compile): a compiled loss keeps only the bf16 logits, a compiled "
                         "block under op-level checkpointing only the outputs its backward reads")
    return Job(seq_len=seq_len, global_batch_size=gbs, precision=s.precision,
               runtime=runtime, stack=s.stack), known


def _expandable_segments(ctx: _Context) -> bool | None:
    """The allocator the checked job runs with, as its launch reads it: a launch script's own
    environment (what it exports, or was given by --env), else --env alone; expandable segments
    only when that environment sets them, else the caching allocator's fragmentation is allowed
    for (placer's own launch exports them, so a plan carries its own runtime). An argument file
    that sets neither is its launcher's: None, as placer's launch runs it (env.sh)."""
    parsed = ctx.parsed
    if parsed.kind in ("megatron", "megatron-deepspeed"):
        on = parsed.settings.expandable_segments
    else:
        on = alloc_conf_expandable(dict(ctx.env))
    if on is None:
        ctx.notes.append(
            "allocator: an argument file, which its launcher's environment runs: checked as "
            "placer's launch.sh runs it after env.sh (expandable segments, no fragmentation "
            "allowance); pass --env PYTORCH_CUDA_ALLOC_CONF=... for another launcher")
        return None
    ctx.notes.append(
        f"allocator: expandable segments ({' or '.join(ALLOC_CONF_VARIABLES)} in the job's "
        "environment): no fragmentation allowance in memory" if on else
        f"allocator: no expandable segments in the job's environment (neither "
        f"{' nor '.join(ALLOC_CONF_VARIABLES)} sets expandable_segments:True): memory allows "
        "for the caching allocator's fragmentation")
    return on


# layout_problem's field -> the settings whose line a finding points at, best first
_FIELD_KEYS = {"layout": ("tp", "pp", "dp"), "layout.cp": ("cp", "seq_len"),
               "layout.vpp": ("vpp", "layers_per_virtual_stage", "pp"),
               "layout.micro_batch_size": ("micro_batch_size", "global_batch_size"),
               "layout.etp": ("etp", "ep")}


def _check_layout(ctx: _Context, layout: Layout, candidate: PlanCandidate | None,
                  degree_problem: bool, placed: Placed | None = None) -> list[Finding]:
    """Degree, group and memory rules of one layout on the context's cluster."""
    findings: list[Finding] = []
    job, seq_known = _job(ctx, layout)
    index = candidate.index if candidate else None
    if not ctx.world_known:
        # Only the rules that hold for every data-parallel size: experts need dp.
        layout = layout.model_copy(update={"ep": 1, "etp": 1})
    if ctx.model is not None:
        world = layout.num_gpus if candidate is not None else ctx.world
        # A stack the dialect gave prices memory only: the file is judged by its framework's
        # own rules (the parser's framework-refuses), as the stack's layout_fields are what
        # placer searches and launches, narrower than the framework (torchtitan 0.2 runs
        # etp = tp and recomputes every Nth block, which torchtitan@0.2 does not list).
        checked = job.model_copy(update={"stack": None}) if ctx.parsed.job is None else job
        problem = layout_problem(layout, ctx.model, checked, world)
        if problem is not None:
            field, value, fix = problem
            rule = "degrees-cluster" if field == "layout" else "degrees-model"
            key = field.removeprefix("layout.")
            findings.append(finding(
                rule, f"{key} = {value}: {fix} (model {ctx.model.name})", ctx.parsed.path,
                ctx.parsed.line_of(*_FIELD_KEYS.get(field, (key,))), candidate=index))
            degree_problem = True
    if (layout.tp * layout.cp * layout.dp) % (layout.ep * layout.etp):
        # No expert grid exists; with a model, layout_problem has already said why.
        if ctx.model is None:
            findings.append(finding(
                "degrees-cluster", f"ep*etp = {layout.ep * layout.etp} does not divide "
                f"tp*cp*dp = {layout.tp * layout.cp * layout.dp}", ctx.parsed.path,
                ctx.parsed.line_of("ep", "etp"), candidate=index))
        return findings
    for gpu in {t.gpu.name: t.gpu for t in ctx.cluster.node_types}.values():
        if (refusal := gpu.fp8_recipe_problem(job.runtime.fp8_recipe)) is not None:
            findings.append(finding("framework-refuses", f"fp8_recipe = "
                                    f"{job.runtime.fp8_recipe}: {refusal}", ctx.parsed.path,
                                    ctx.parsed.line_of("fp8_recipe"), candidate=index))
    grid = MeshGrid(layout, candidate.order if candidate else ctx.parsed.order)
    if placed is None:
        placed = _natural(ctx, grid)
    findings += group_findings(placed)
    if ctx.model is not None and not degree_problem and seq_known and ctx.world_known:
        findings += _memory(ctx, layout, job, index)
    return findings


def _topology(ctx: _Context) -> ClusterTopology:
    return topology_of(ctx.cluster)


def _natural(ctx: _Context, grid: MeshGrid) -> Placed:
    """Rank r = logical index r, on the GPU torchrun gives rank r."""
    topo = _topology(ctx)
    size = grid.size
    if ctx.per_node and ctx.per_node != _gpus_per_node(ctx.cluster):
        slots = tuple(topo.slot_of(r // ctx.per_node, r % ctx.per_node) for r in range(size))
        ctx.notes.append(f"{ctx.per_node} processes per node: rank r on GPU r mod "
                         f"{ctx.per_node} of node r div {ctx.per_node}")
    else:
        slots = tuple(range(size))
    return Placed(grid=grid, rank_of=tuple(range(size)), slot_of=slots, topology=topo,
                  file=ctx.parsed.path, lines=ctx.parsed.lines)


def _memory(ctx: _Context, layout: Layout, job: Job, index: int | None) -> list[Finding]:
    """An error when the predicted peak exceeds the GPU's memory; a warning when it only eats
    into the job's headroom (the margin placer keeps for what the estimate misses)."""
    assert ctx.model is not None
    options = job_options(job)
    wrapper = ctx.parsed.settings.deepspeed_optimizer
    if wrapper is not None:  # how DeepSpeed's optimizer wrapper holds gradients and state
        options = replace(options, **memory_flags(wrapper))
    compiled = ctx.parsed.settings.compile_components
    if compiled:  # torchtitan's compile.components: each block ("model"), the loss
        options = replace(options, compiled_layers="model" in compiled,
                          compiled_loss="loss" in compiled)
    live = ctx.parsed.settings.zero3_max_live_params
    if live is not None:
        options = replace(options, zero3_max_live_params=live)
    memory = memory_estimate(ctx.model, ctx.cluster, job, layout, options, profile=ctx.profile)
    if memory.total_bytes <= memory.capacity_bytes:
        return []
    physical = memory_estimate(ctx.model, ctx.cluster, job.model_copy(
        update={"memory_headroom": 0.0}), layout, options).capacity_bytes
    parts = {"weights": memory.weights_bytes, "gradients": memory.gradients_bytes,
             "optimizer": memory.optimizer_bytes, "activations": memory.activations_bytes}
    biggest = ", ".join(f"{name} {value / GIB:.1f}" for name, value in
                        sorted(parts.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
    # cost.memory_estimate sizes capacity by the cluster's smallest GPU
    gpu = min((t.gpu for t in ctx.cluster.node_types), key=lambda g: g.capacity_bytes).name
    over = memory.total_bytes > physical
    allocator = ""
    if memory.fragmentation_bytes:
        allocator = (f", or export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (its "
                     f"{memory.fragmentation_bytes / GIB:.1f} GiB are the caching allocator's "
                     "fragmentation allowance)")
    limit = (f"the {physical / GIB:.1f} GiB of {gpu}" if over else
             f"the {memory.capacity_bytes / GIB:.1f} GiB usable on {gpu} with "
             f"{job.memory_headroom:.0%} headroom (it fits the {physical / GIB:.1f} GiB)")
    return [finding(
        "memory-over-capacity",
        f"predicted peak {memory.total_bytes / GIB:.1f} GiB per GPU (pipeline stage "
        f"{memory.worst_stage}: {biggest} GiB) exceeds {limit} for {ctx.model.name} at "
        f"seq_len={job.seq_len}, micro batch {layout.micro_batch_size}; shard more (zero, tp, "
        f"pp) or recompute{allocator}",
        ctx.parsed.path, ctx.parsed.line_of("micro_batch_size", "tp", "seq_len"),
        candidate=index, severity=None if over else "warning")]


# ----- plans: explicit rank maps -------------------------------------------------------------


def _check_candidate(ctx: _Context, layout: Layout, candidate: PlanCandidate) -> list[Finding]:
    findings: list[Finding] = []
    topo = _topology(ctx)
    grid = MeshGrid(layout, candidate.order)
    placed, problem = _placed_from_rank_map(ctx, grid, candidate, topo)
    if problem is not None:
        return [problem]
    findings += _torchrun_agreement(ctx, candidate)
    assert placed is not None
    job = ctx.parsed.job
    placed = Placed(grid=placed.grid, rank_of=placed.rank_of, slot_of=placed.slot_of,
                    topology=topo, file=ctx.parsed.path, lines=ctx.parsed.lines,
                    candidate=candidate.index,
                    allow_tp_outside_nvlink=bool(job and job.allow_tp_outside_nvlink))
    findings += _check_layout(ctx, layout, candidate, False, placed)
    return findings


def _placed_from_rank_map(ctx: _Context, grid: MeshGrid, candidate: PlanCandidate,
                          topo: ClusterTopology) -> tuple[Placed | None, Finding | None]:
    """Logical index -> (rank, slot) from the map's coords and GPUs, or the first defect."""

    def invalid(message: str) -> tuple[None, Finding]:
        return None, finding("rank-map-invalid", message, ctx.parsed.path,
                             candidate=candidate.index)

    entries = sorted(candidate.rank_map, key=lambda e: e.rank)
    if [e.rank for e in entries] != list(range(grid.size)):
        return invalid(f"the rank map must list ranks 0..{grid.size - 1} once each for "
                       f"{grid.layout.compact()} ({len(entries)} entries)")
    rank_of = [-1] * grid.size
    slot_of = [-1] * grid.size
    used: dict[int, int] = {}
    for entry in entries:
        try:
            slot = topo.slot_of(entry.node, entry.gpu)
        except (ValueError, IndexError):
            return invalid(f"rank {entry.rank} is on node {entry.node} GPU {entry.gpu}, which "
                           f"cluster {ctx.cluster.name} does not have healthy")
        if slot in used:
            return invalid(f"ranks {used[slot]} and {entry.rank} are both on node {entry.node} "
                           f"GPU {entry.gpu}")
        used[slot] = entry.rank
        coords = {}
        for dim in DENSE_DIMS:
            size = grid.sizes[dim]
            value = entry.coords.get(dim, 0 if size == 1 else None)
            if value is None or not 0 <= value < size:
                return invalid(f"rank {entry.rank} has {dim} coordinate {value!r}; the layout "
                               f"needs 0..{size - 1}")
            coords[dim] = value
        index = grid.logical_index(coords)
        if rank_of[index] >= 0:
            return invalid(f"ranks {rank_of[index]} and {entry.rank} have the same coordinates "
                           f"{coords}")
        rank_of[index], slot_of[index] = entry.rank, slot
    return Placed(grid=grid, rank_of=tuple(rank_of), slot_of=tuple(slot_of), topology=topo,
                  file=ctx.parsed.path, lines=ctx.parsed.lines), None


def _torchrun_agreement(ctx: _Context, candidate: PlanCandidate) -> list[Finding]:
    expected = torchrun_numbering({(e.node, e.gpu) for e in candidate.rank_map})
    wrong = [(e, *expected[(e.node, e.gpu)]) for e in sorted(candidate.rank_map,
                                                             key=lambda e: e.rank)
             if (e.rank, e.local_rank) != expected[(e.node, e.gpu)]]
    if not wrong:
        return []
    entry, rank, local = wrong[0]
    more = f" (and {len(wrong) - 1} more ranks)" if len(wrong) > 1 else ""
    return [finding(
        "rank-map-torchrun",
        f"node {entry.node} GPU {entry.gpu} is listed as rank {entry.rank} local rank "
        f"{entry.local_rank}, but torchrun numbers ranks node by node and gives it rank {rank} "
        f"local rank {local}: the groups that run would not be the planned ones{more}",
        ctx.parsed.path, candidate=candidate.index,
        ranks=sorted(e.rank for e, _, _ in wrong), nodes=sorted({e.node for e, _, _ in wrong}))]


__all__ = ["CheckOptions", "check_config", "torchrun_numbering"]
