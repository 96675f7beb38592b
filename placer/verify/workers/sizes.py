"""Buffer sizes the workers really send (torch-free, so predictions use the same bytes)."""

from __future__ import annotations

ELEMENT_BYTES = 4  # float32 buffers: gloo reduces them on every CPU, NCCL on every GPU


def elements_for(nbytes: int, group_size: int) -> int:
    """float32 elements for ``nbytes``, rounded up to a multiple of the group size (>= 1 each)."""
    per_rank = max(1, -(-int(nbytes) // (ELEMENT_BYTES * group_size)))
    return per_rank * group_size


def real_bytes(collective: str, nbytes: int, group_size: int) -> int:
    """Bytes a worker moves for a requested ``nbytes`` (whole elements, split evenly)."""
    return elements_for(nbytes, 1 if collective == "send_recv" else group_size) * ELEMENT_BYTES
