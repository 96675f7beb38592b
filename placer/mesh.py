"""The parallel grid of a layout: mesh orders, coordinates and process groups.

A *mesh order* lists the dense dimensions innermost first, as Megatron's ``order`` does
(``tp-cp-dp-pp``: consecutive ranks differ in tp). The *logical index* of a grid point is its
position in that order. A placement then maps logical indices to GPU slots (torchrun ranks);
the natural placement is the identity.

Experts live on a second grid over the same ranks (Megatron-Core's expert generator): within a
pipeline stage the ``tp x cp x dp`` points, flattened in mesh order, are split as
``etp`` (innermost) x ``ep`` x ``edp``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import permutations

from placer.dims import DEFAULT_ORDER, DENSE_DIMS, EXPERT_DIMS, Dim
from placer.errors import InputError
from placer.spec.layout import Layout


def parse_order(text: str | Sequence[str]) -> tuple[Dim, ...]:
    """Parse ``tp-cp-ep-dp-pp`` (Megatron spelling, innermost first) into the dense order.

    ``ep`` is accepted and dropped: experts follow the dense order. Missing dims are appended
    in the default order, as Megatron does for dims of size 1.
    """
    tokens = [t.strip().lower() for t in (text.split("-") if isinstance(text, str) else text)]
    tokens = [t for t in tokens if t and t != Dim.EP]
    unknown = [t for t in tokens if t not in DENSE_DIMS]
    if unknown or len(set(tokens)) != len(tokens):
        raise InputError("mesh order", text, "use a permutation of tp-cp-dp-pp, e.g. tp-cp-dp-pp")
    dims = tuple(Dim(t) for t in tokens)
    return dims + tuple(d for d in DEFAULT_ORDER if d not in dims)


def torchrun_numbering(used: Iterable[tuple[int, int]]
                       ) -> dict[tuple[int, int], tuple[int, int]]:
    """(node, gpu) -> (rank, local rank) as torchrun's static rendezvous numbers the used GPUs:
    nodes in order, each a contiguous block, local ranks in ascending GPU order (docs/sources.md
    1.3; the launcher sets CUDA_VISIBLE_DEVICES to the node's used GPUs ascending). The one
    numbering ``launch`` writes and ``check`` checks plans against."""
    numbering: dict[tuple[int, int], tuple[int, int]] = {}
    per_node: dict[int, int] = {}
    for node, gpu in sorted(used):
        local = per_node.get(node, 0)
        per_node[node] = local + 1
        numbering[(node, gpu)] = (len(numbering), local)
    return numbering


def order_text(order: Sequence[str]) -> str:
    return "-".join(order)


def candidate_orders(layout: Layout) -> list[tuple[str, ...]]:
    """Distinct mesh orders for a layout: dims of size 1 do not change the rank map."""
    seen: dict[tuple[str, ...], tuple[str, ...]] = {}
    for order in permutations(DENSE_DIMS):
        key = tuple(d for d in order if getattr(layout, d) > 1)
        seen.setdefault(key, order)
    return sorted(seen.values(), key=lambda o: (o != DEFAULT_ORDER, o))


@dataclass(frozen=True)
class MeshGrid:
    """Coordinates and groups of every logical index for one layout and mesh order."""

    layout: Layout
    order: tuple[str, ...] = DEFAULT_ORDER

    @cached_property
    def sizes(self) -> dict[str, int]:
        return {d: getattr(self.layout, d) for d in DENSE_DIMS}

    @cached_property
    def strides(self) -> dict[str, int]:
        """Logical-index stride of each dense dim (innermost stride 1)."""
        strides, step = {}, 1
        for dim in self.order:
            strides[dim] = step
            step *= self.sizes[dim]
        return strides

    @property
    def size(self) -> int:
        return self.layout.num_gpus

    def logical_index(self, coords: dict[str, int]) -> int:
        return sum(coords[d] * self.strides[d] for d in DENSE_DIMS)

    def dense_coords(self, index: int) -> dict[str, int]:
        return {d: (index // self.strides[d]) % self.sizes[d] for d in DENSE_DIMS}

    def _stage_local_index(self, coords: dict[str, int]) -> int:
        """Position of a point among the tp*cp*dp points of its stage, in mesh order."""
        local, step = 0, 1
        for dim in self.order:
            if dim == Dim.PP:
                continue
            local += coords[dim] * step
            step *= self.sizes[dim]
        return local

    def coords(self, index: int) -> dict[str, int]:
        """Dense and expert coordinates of a logical index."""
        coords = self.dense_coords(index)
        local = self._stage_local_index(coords)
        etp, ep = self.layout.etp, self.layout.ep
        coords[Dim.ETP] = local % etp
        coords[Dim.EP] = (local // etp) % ep
        coords[Dim.EDP] = local // (etp * ep)
        return coords

    def group_of(self, index: int, dims: Sequence[str]) -> list[int]:
        """Logical indices that share every coordinate of ``index`` except ``dims``."""
        return [i for i in self.groups(dims) if index in i][0]

    def groups(self, dims: str | Sequence[str]) -> list[list[int]]:
        """All groups of a dimension (``"tp"``, ``"dp_cp"``, ``"ep"``...), each sorted.

        Groups are ordered by their smallest member, so group ids are stable.
        """
        dim_tuple = tuple(dims.split("_")) if isinstance(dims, str) else tuple(dims)
        keyed: dict[tuple[int, ...], list[int]] = {}
        for index in range(self.size):
            coords = self.coords(index)
            if set(dim_tuple) & set(EXPERT_DIMS):
                key = (coords[Dim.PP],) + tuple(
                    coords[d] for d in EXPERT_DIMS if d not in dim_tuple)
            else:
                key = tuple(coords[d] for d in DENSE_DIMS if d not in dim_tuple)
            keyed.setdefault(key, []).append(index)
        return sorted(keyed.values(), key=lambda g: g[0])

    def representative_group(self, dim: str) -> list[int]:
        """The group of ``dim`` that holds logical index 0 (cheap: no full enumeration)."""
        if dim in DENSE_DIMS:
            return [i * self.strides[dim] for i in range(self.sizes[dim])]
        return self.groups(dim)[0]

    def coords_of(self, indices: Sequence[int]) -> list[dict[str, int]]:
        """``coords`` of many indices, computed a dimension at a time (same keys, same values;
        several times faster, which matters for rank maps of 100,000 ranks)."""
        sizes, strides = self.sizes, self.strides
        columns = {d: [(i // strides[d]) % sizes[d] for i in indices] for d in DENSE_DIMS}
        local, step = [0] * len(indices), 1
        for d in self.order:
            if d != Dim.PP:
                local = [so_far + c * step for so_far, c in zip(local, columns[d], strict=True)]
                step *= sizes[d]
        etp, ep = self.layout.etp, self.layout.ep
        columns[Dim.ETP] = [x % etp for x in local]
        columns[Dim.EP] = [(x // etp) % ep for x in local]
        columns[Dim.EDP] = [x // (etp * ep) for x in local]
        keys = list(columns)
        rows = zip(*columns.values(), strict=True)
        return [dict(zip(keys, values, strict=True)) for values in rows]

    def iter_coords(self) -> Iterator[dict[str, int]]:
        for index in range(self.size):
            yield self.coords(index)
