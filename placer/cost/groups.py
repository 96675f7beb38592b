"""The representative process group of each parallel dimension, and its links.

For every dimension the group holding logical index 0 is taken (``MeshGrid``), or on request the
worst-placed group, mapped through the placement to GPU slots, and handed to the topology with
every other group of that dimension running at the same time (``concurrent="all"``). Pricing
enumerates no ranks: a group costs O(its size), and results are cached per (cluster, layout
degrees, order) for the natural placement, and by the topology per slot tuple otherwise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from placer.cost.collectives import GroupLink
from placer.dims import Dim, Group
from placer.errors import InputError
from placer.mesh import MeshGrid
from placer.spec.cluster import Cluster
from placer.spec.layout import Layout

GroupLinks = dict[Group, GroupLink]
"""Links per priced group: tp, cp, pp, dp_cp (the gradient group), ep, etp, edp."""

_CACHE_SIZE = 4096
_NATURAL: OrderedDict[tuple[object, ...], tuple[Cluster, GroupLinks]] = OrderedDict()


def representative_groups(layout: Layout, order: tuple[str, ...], experts: bool = True,
                          dims: frozenset[Group] | None = None) -> dict[Group, list[int]]:
    """Logical indices of the group holding index 0, for every dimension of size > 1 (the
    expert dimensions etp, ep and edp only with ``experts``: a dense model has none; only
    those in ``dims`` when given)."""
    return {dim: list(members) for dim, members in _representative_groups(
        layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.etp, tuple(order),
        experts, dims).items()}


@lru_cache(maxsize=4096)
def _representative_groups(tp: int, pp: int, dp: int, cp: int, ep: int, etp: int,
                           order: tuple[str, ...], experts: bool,
                           dims: frozenset[Group] | None = None
                           ) -> dict[Group, tuple[int, ...]]:
    """Cached by degrees: the search prices many layouts (micro-batch, ZeRO, recompute) that
    share them, and an expert-data-parallel group can hold thousands of ranks."""
    layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp)
    grid = MeshGrid(layout, order)
    strides = grid.strides
    groups: dict[Group, list[int]] = {}
    wanted = set(Group) if dims is None else dims
    for group in (Group.TP, Group.CP, Group.PP):
        if getattr(layout, group) > 1 and group in wanted:
            groups[group] = grid.representative_group(group)
    if layout.dp_cp > 1 and Group.DP_CP in wanted:
        groups[Group.DP_CP] = sorted(i * strides[Dim.DP] + j * strides[Dim.CP]
                                     for i in range(layout.dp) for j in range(layout.cp))
    expert = {Group.ETP: range(layout.etp),
              Group.EP: range(0, layout.ep * layout.etp, layout.etp),
              Group.EDP: range(0, layout.expert_dp * layout.ep * layout.etp,
                               layout.ep * layout.etp)}
    for dim, locals_ in expert.items() if experts else ():
        if len(locals_) > 1 and dim in wanted:
            logical = _stage_locals_to_logical(layout, order, strides, locals_.stop)
            groups[dim] = sorted(logical[locals_.start:locals_.stop:locals_.step])
    return {dim: tuple(members) for dim, members in groups.items()}


def _stage_locals_to_logical(layout: Layout, order: tuple[str, ...], strides: dict[str, int],
                             count: int) -> list[int]:
    """Logical indices of stage 0's tp x cp x dp points in mesh order (mesh.py), the i-th at
    position i, for at least the first ``count`` of them. A local index is a mixed-radix number
    over the non-PP dimensions in mesh order (the first fastest), and its logical index the same
    digits times the strides, so the table grows one dimension at a time, each only to the
    digits that ``count`` reaches (an EP group of 256 ranks costs a list of 256 sums, not 256
    digit loops)."""
    logical = [0]
    for dim in order:
        if dim == Dim.PP or len(logical) >= count:
            continue
        size, stride = getattr(layout, dim), strides[dim]
        digits = min(size, -(-count // len(logical)))
        logical = [base + digit * stride for digit in range(digits) for base in logical]
    return logical


def worst_placed_groups(cluster: Cluster, layout: Layout, order: tuple[str, ...],
                        placement: Sequence[int], experts: bool = True) -> dict[Group, list[int]]:
    """For every dimension, the group whose GPUs span the most nodes under ``placement`` (ties:
    the representative group). On a regular cluster every group of a dimension sits alike;
    around failed GPUs they may not, and the slowest group paces the step. O(GPUs) per
    dimension: dense groups (and dp x cp) are translates of the representative one."""
    from placer.topology import topology_of

    topo = topology_of(cluster)
    grid = MeshGrid(layout, order)
    node = [topo.node_of(slot) for slot in placement]
    out: dict[Group, list[int]] = {}
    for dim, rep in representative_groups(layout, order, experts).items():
        if dim.expert:
            groups: Iterable[list[int]] = grid.groups(dim)
        else:
            steps = [(grid.strides[d], grid.sizes[d]) for d in dim.dims]
            bases = (i for i in range(layout.num_gpus)
                     if all((i // stride) % size == 0 for stride, size in steps))
            groups = ([base + offset for offset in rep] for base in bases)
        worst, span = rep, len({node[i] for i in rep})
        for group in groups:
            nodes = len({node[i] for i in group})
            if nodes > span:
                worst, span = group, nodes
        out[dim] = worst
    return out


def group_links(cluster: Cluster, layout: Layout, order: tuple[str, ...],
                placement: Sequence[int] | None,
                groups: Mapping[Group, list[int]] | None = None,
                experts: bool = True, dims: frozenset[Group] | None = None) -> GroupLinks:
    """GroupLink of every dimension's representative group (or the given ``groups``, logical
    indices per dimension) under full concurrency; expert dimensions only with ``experts``;
    only the dimensions in ``dims`` when given (the search's floor prices TP, CP and EP alone,
    without building a data-parallel group of thousands of ranks)."""
    key: tuple[object, ...] | None = None
    if placement is None and groups is None:
        key = (id(cluster), layout.tp, layout.cp, layout.dp, layout.pp, layout.ep, layout.etp,
               order, experts, dims)
        hit = _NATURAL.get(key)
        if hit is not None and hit[0] is cluster:
            _NATURAL.move_to_end(key)
            return hit[1]
    from placer.topology import topology_of

    topo = topology_of(cluster)
    links: GroupLinks = {}
    for dim, members in representative_groups(layout, order, experts, dims).items():
        members = (groups or {}).get(dim, members)
        slots = members if placement is None else [placement[i] for i in members]
        link = topo.group_link(slots, concurrent="all")
        if link.link_class == "network" and min(link.inter_bytes_per_s,
                                                link.node_inter_bytes_per_s) <= 0:
            raise InputError("layout", layout.compact(),
                             f"its {dim} group spans nodes without a usable network")
        links[dim] = link
    if key is not None:
        _NATURAL[key] = (cluster, links)
        while len(_NATURAL) > _CACHE_SIZE:
            _NATURAL.popitem(last=False)
    return links
