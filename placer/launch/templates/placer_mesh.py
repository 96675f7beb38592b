"""placer_mesh: apply the rank placement in placer's ``rankmap.json`` inside a training job.

Copy this file next to your training script (it needs only Python and torch), launch with the
torchrun command placer generated, and at the start of the script call::

    import placer_mesh
    pm = placer_mesh.setup()      # reads $PLACER_RANKMAP, else rankmap.json next to this file
    tp_group = pm.group("tp")     # this rank's tensor-parallel ProcessGroup
    mesh = pm.mesh                # DeviceMesh with placer's rank layout, e.g. mesh["tp"]
    ...
    pm.destroy()                  # at the end: barrier, then destroy_process_group()

setup() first checks that the launcher assigned ranks as the map expects (otherwise the layout
placer optimised would silently not be the one that runs), pins the GPU, then builds the groups.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import warnings
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

FORMAT = "placer-rankmap/1"
DEFAULT_TIMEOUT_S = 600.0

__all__ = [
    "FORMAT",
    "PlacerMesh",
    "PlacerMeshError",
    "check_launch_env",
    "default_rankmap_path",
    "load_rankmap",
    "setup",
    "validate_rankmap",
]


class PlacerMeshError(RuntimeError):
    """The rank map is invalid, or the job was not launched the way the map expects."""


def default_rankmap_path() -> Path:
    """``$PLACER_RANKMAP`` if set, else ``rankmap.json`` next to this module, else its gzip
    (``rankmap.json.gz``: the Kubernetes ConfigMap carries it compressed to stay under 1 MiB)."""
    env = os.environ.get("PLACER_RANKMAP")
    if env:
        return Path(env)
    plain = Path(__file__).resolve().with_name("rankmap.json")
    packed = plain.with_name("rankmap.json.gz")
    return packed if packed.exists() and not plain.exists() else plain


def load_rankmap(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Read and validate a rank map file, plain or gzip (see :func:`validate_rankmap`)."""
    path = Path(path) if path is not None else default_rankmap_path()
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise PlacerMeshError(
            f"cannot read the rank map {path}: {getattr(exc, 'strerror', None) or exc}; pass its "
            "path to setup() "
            "or set PLACER_RANKMAP"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlacerMeshError(f"{path}: not valid JSON ({exc})") from exc
    return validate_rankmap(data, source=str(path))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mesh_coords(mesh: Any, shape: list[int], where: str) -> dict[tuple[int, ...], int]:
    """Map every coordinate of the nested ``mesh`` list to its rank, checking the shape."""
    out: dict[tuple[int, ...], int] = {}

    def walk(node: Any, prefix: tuple[int, ...]) -> None:
        depth = len(prefix)
        if depth == len(shape):
            if not _is_int(node):
                raise PlacerMeshError(f"{where}: mesh{list(prefix)} is {node!r}, not a rank")
            out[prefix] = node
            return
        if not isinstance(node, list) or len(node) != shape[depth]:
            got = len(node) if isinstance(node, list) else type(node).__name__
            raise PlacerMeshError(
                f"{where}: mesh{list(prefix)} has {got} entries at depth {depth}, but "
                f"mesh_shape says {shape[depth]}"
            )
        for k, child in enumerate(node):
            walk(child, (*prefix, k))

    walk(mesh, ())
    return out


def validate_rankmap(data: Any, source: str = "rankmap.json") -> dict[str, Any]:
    """Check that ``data`` is a consistent placer-rankmap/1 document; return it unchanged.

    Consistency matters because every rank must build identical groups: a mesh that is not a
    permutation of the ranks, or groups that disagree with the mesh, would hang or mis-route.
    """

    def fail(message: str) -> PlacerMeshError:
        return PlacerMeshError(f"{source}: {message}")

    if not isinstance(data, dict):
        raise fail("expected a JSON object at the top level")
    if data.get("format") != FORMAT:
        raise fail(f"format is {data.get('format')!r}, expected {FORMAT!r}")
    for key in ("world_size", "mesh_dim_names", "mesh_shape", "mesh", "nodes", "ranks", "groups"):
        if key not in data:
            raise fail(f"required field {key!r} is missing")
    world = data["world_size"]
    if not _is_int(world) or world < 1:
        raise fail(f"world_size is {world!r}, expected an integer >= 1")
    names, shape = data["mesh_dim_names"], data["mesh_shape"]
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) and n for n in names)
        or len(set(names)) != len(names)
    ):
        raise fail(f"mesh_dim_names is {names!r}, expected a list of distinct non-empty names")
    if (
        not isinstance(shape, list)
        or len(shape) != len(names)
        or not all(_is_int(s) and s >= 1 for s in shape)
    ):
        raise fail(f"mesh_shape is {shape!r}, expected {len(names)} positive integers")
    if math.prod(shape) != world:
        raise fail(f"mesh_shape {shape} holds {math.prod(shape)} ranks, world_size is {world}")
    coords_of = _mesh_coords(data["mesh"], shape, source)
    if sorted(coords_of.values()) != list(range(world)):
        raise fail(f"mesh must contain each rank 0..{world - 1} exactly once")
    rank_coords = {rank: coord for coord, rank in coords_of.items()}

    nodes = data["nodes"]
    if not isinstance(nodes, list) or not nodes:
        raise fail("nodes must be a non-empty list")
    node_size: dict[int, int] = {}
    node_devices: dict[int, list[str]] = {}
    for k, node in enumerate(nodes):
        if not isinstance(node, dict) or node.get("index") != k:
            raise fail(f"nodes[{k}] must be an object with index {k}")
        count, cvd = node.get("num_ranks"), node.get("cuda_visible_devices", "")
        if not _is_int(count) or count < 1:
            raise fail(f"nodes[{k}].num_ranks is {count!r}, expected an integer >= 1")
        if not isinstance(cvd, str):
            raise fail(f"nodes[{k}].cuda_visible_devices is {cvd!r}, expected a string like '0,1'")
        devices = [d.strip() for d in cvd.split(",") if d.strip()]
        if devices and len(devices) < count:
            raise fail(
                f"nodes[{k}] has {count} ranks but cuda_visible_devices {cvd!r} lists only "
                f"{len(devices)} devices"
            )
        node_size[k], node_devices[k] = count, devices
    if sum(node_size.values()) != world:
        raise fail(f"nodes hold {sum(node_size.values())} ranks in total, world_size is {world}")

    groups = data["groups"]
    if not isinstance(groups, dict):
        raise fail("groups must be an object mapping a dimension name to a list of rank lists")
    group_of: dict[str, dict[int, int]] = {}
    for dim, dim_groups in groups.items():
        if not isinstance(dim_groups, list) or not all(
            isinstance(g, list) and g and all(_is_int(r) for r in g) for g in dim_groups
        ):
            raise fail(f"groups[{dim!r}] must be a list of non-empty lists of ranks")
        members: dict[int, int] = {}
        for gid, group in enumerate(dim_groups):
            if group != sorted(set(group)):
                raise fail(f"groups[{dim!r}][{gid}] = {group} must be sorted without repeats")
            for r in group:
                if r in members:
                    raise fail(f"rank {r} is in two {dim!r} groups ({members[r]} and {gid})")
                members[r] = gid
        if sorted(members) != list(range(world)):
            raise fail(f"groups[{dim!r}] must cover each rank 0..{world - 1} exactly once")
        group_of[dim] = members
    for axis, dim in enumerate(names):
        if dim not in groups:
            continue
        from_mesh: dict[tuple[int, ...], set[int]] = {}
        for coord, r in coords_of.items():
            from_mesh.setdefault(coord[:axis] + coord[axis + 1 :], set()).add(r)
        expected = sorted(sorted(g) for g in from_mesh.values())
        if sorted(groups[dim]) != expected:
            raise fail(
                f"groups[{dim!r}] = {groups[dim]} disagrees with the mesh, which gives {expected}"
            )

    ranks = data["ranks"]
    if not isinstance(ranks, list) or len(ranks) != world:
        raise fail(f"ranks must list {world} entries, one per rank")
    seen_slots: dict[tuple[int, int], int] = {}
    for k, entry in enumerate(ranks):
        if not isinstance(entry, dict):
            raise fail(f"ranks[{k}] must be an object")
        r, node, local, gpu = (entry.get(f) for f in ("rank", "node", "local_rank", "gpu"))
        if r != k:
            raise fail(f"ranks[{k}].rank is {r!r}; entries must be in rank order 0..{world - 1}")
        if node not in node_size:
            raise fail(f"ranks[{k}].node is {node!r}, not a node index 0..{len(nodes) - 1}")
        if not _is_int(local) or not 0 <= local < node_size[node]:
            raise fail(
                f"ranks[{k}].local_rank is {local!r}, node {node} has {node_size[node]} ranks"
            )
        if (node, local) in seen_slots:
            raise fail(
                f"ranks {seen_slots[(node, local)]} and {k} both use node {node} local_rank {local}"
            )
        seen_slots[(node, local)] = k
        if not _is_int(gpu) or gpu < 0:
            raise fail(f"ranks[{k}].gpu is {gpu!r}, expected a GPU index >= 0")
        devices = node_devices[node]
        if devices and devices[local].isdigit() and int(devices[local]) != gpu:
            raise fail(
                f"ranks[{k}] says gpu {gpu}, but local_rank {local} runs on device "
                f"{devices[local]} of cuda_visible_devices {','.join(devices)!r}"
            )
        coords = entry.get("coords", {})
        if not isinstance(coords, dict):
            raise fail(f"ranks[{k}].coords must be an object")
        for axis, dim in enumerate(names):
            if coords.get(dim, rank_coords[k][axis]) != rank_coords[k][axis]:
                raise fail(
                    f"ranks[{k}].coords[{dim!r}] is {coords[dim]!r}, but the mesh puts rank {k} "
                    f"at {dim}={rank_coords[k][axis]}"
                )
        rank_groups = entry.get("groups", {})
        if not isinstance(rank_groups, dict):
            raise fail(f"ranks[{k}].groups must be an object")
        for dim, gid in rank_groups.items():
            if dim in group_of and gid != group_of[dim][k]:
                raise fail(
                    f"ranks[{k}].groups[{dim!r}] is {gid!r}, but rank {k} is in "
                    f"groups[{dim!r}][{group_of[dim][k]}]"
                )
    return data


def check_launch_env(
    rankmap: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    source: str = "rankmap.json",
) -> dict[str, Any]:
    """Check that the launcher's RANK/LOCAL_RANK/GROUP_RANK/WORLD_SIZE match the map.

    Returns this rank's entry of ``rankmap["ranks"]``. A mismatch means the job was launched
    with other node ranks or process counts than placer planned for (for example torchrun's c10d
    rendezvous ordering nodes by hostname), so the intended placement would not be applied.
    """
    env = os.environ if env is None else env
    values: dict[str, int] = {}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"):
        raw = env.get(key)
        if raw is None or raw == "":
            if key != "GROUP_RANK":
                raise PlacerMeshError(
                    f"environment variable {key} is not set; launch this script with torchrun "
                    "(the command placer generated), which sets RANK, LOCAL_RANK and WORLD_SIZE"
                )
            continue
        try:
            values[key] = int(raw)
        except ValueError:
            raise PlacerMeshError(f"environment variable {key}={raw!r} is not an integer") from None
    rank, local, world = values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"]
    node = values.get("GROUP_RANK")
    gave = f"RANK={rank} LOCAL_RANK={local} WORLD_SIZE={world}"
    if node is not None:
        gave += f" GROUP_RANK={node}"
    expected_world = rankmap["world_size"]
    if world != expected_world or not 0 <= rank < expected_world:
        raise PlacerMeshError(
            f"the launcher gave {gave}, but {source} expects world_size {expected_world}; "
            "launch with the node and process counts placer generated"
        )
    entry = dict(rankmap["ranks"][rank])
    if entry["local_rank"] != local or (node is not None and entry["node"] != node):
        raise PlacerMeshError(
            f"the launcher gave {gave}, but {source} expects rank {rank} on node {entry['node']} "
            f"as local_rank {entry['local_rank']} (GROUP_RANK={entry['node']} "
            f"LOCAL_RANK={entry['local_rank']}); use the static rendezvous with --node-rank set "
            "to the node index, and the --nproc-per-node placer generated"
        )
    return entry


class PlacerMesh:
    """The process groups of one rank, built from a rank map by :func:`setup`."""

    def __init__(
        self,
        rankmap: dict[str, Any],
        entry: dict[str, Any],
        mesh: DeviceMesh,
        groups: dict[str, tuple[dist.ProcessGroup, list[int]]],
        device: torch.device,
    ) -> None:
        self.rankmap = rankmap
        self.mesh = mesh
        self.device = device
        self.rank: int = entry["rank"]
        self.node: int = entry["node"]
        self.local_rank: int = entry["local_rank"]
        self.gpu: int = entry["gpu"]
        self.coords: dict[str, int] = dict(entry.get("coords", {}))
        self.world_size: int = rankmap["world_size"]
        self._groups = groups

    @property
    def dims(self) -> list[str]:
        """Names of every dimension with groups (mesh dims plus e.g. ep, dp_cp)."""
        return sorted(self._groups)

    def _lookup(self, dim: str) -> tuple[dist.ProcessGroup, list[int]]:
        try:
            return self._groups[dim]
        except KeyError:
            raise KeyError(f"no groups for dimension {dim!r}; the map has {self.dims}") from None

    def group(self, dim: str) -> dist.ProcessGroup:
        """This rank's process group in dimension ``dim``."""
        return self._lookup(dim)[0]

    def group_ranks(self, dim: str) -> list[int]:
        """Global ranks of this rank's group in ``dim``, sorted (group rank = list index)."""
        return list(self._lookup(dim)[1])

    def destroy(self) -> None:
        """Barrier, then destroy all process groups.

        The barrier keeps a fast rank from tearing down gloo while others still use it, which
        otherwise can abort the process at exit.
        """
        if not dist.is_initialized():
            return
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()
        dist.destroy_process_group()


def setup(
    rankmap_path: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> PlacerMesh:
    """Validate the map and launch env, pin the GPU, init the default group, build all groups.

    Collective: every rank of the job must call it. Backend: nccl when CUDA is available, else
    gloo, unless ``backend`` is given.
    """
    path = Path(rankmap_path) if rankmap_path is not None else default_rankmap_path()
    rankmap = load_rankmap(path)
    entry = check_launch_env(rankmap, source=str(path))
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    backend = backend or ("nccl" if use_cuda else "gloo")
    local = entry["local_rank"]
    if use_cuda:
        count = torch.cuda.device_count()
        if local >= count:
            raise PlacerMeshError(
                f"LOCAL_RANK={local} but only {count} CUDA devices are visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
            )
        planned = rankmap["nodes"][entry["node"]].get("cuda_visible_devices", "")
        actual = os.environ.get("CUDA_VISIBLE_DEVICES")
        if planned and actual is not None and actual.replace(" ", "") != planned.replace(" ", ""):
            warnings.warn(
                f"CUDA_VISIBLE_DEVICES is {actual!r} but {path} planned {planned!r} for node "
                f"{entry['node']}; rank {entry['rank']} may not run on GPU {entry['gpu']}",
                stacklevel=2,
            )
        # Before any process group exists, so NCCL and DeviceMesh bind to this device.
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timeout)
    elif (dist.get_rank(), dist.get_world_size()) != (entry["rank"], rankmap["world_size"]):
        raise PlacerMeshError(
            f"a process group already exists with rank {dist.get_rank()} of "
            f"{dist.get_world_size()}, but {path} expects rank {entry['rank']} of "
            f"{rankmap['world_size']}"
        )
    mesh = DeviceMesh(
        device.type,
        mesh=torch.tensor(rankmap["mesh"], dtype=torch.int64),
        mesh_dim_names=tuple(rankmap["mesh_dim_names"]),
    )
    mine: dict[str, tuple[dist.ProcessGroup, list[int]]] = {}
    # new_group is collective over the whole world: same calls, same order, on every rank.
    for dim in sorted(rankmap["groups"]):
        for ranks in rankmap["groups"][dim]:
            pg = dist.new_group(ranks=ranks, timeout=timeout, use_local_synchronization=False)
            if entry["rank"] in ranks:
                mine[dim] = (pg, list(ranks))
    return PlacerMesh(rankmap, entry, mesh, mine, device)
