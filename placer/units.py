"""Units of what a person reads. Files keep bytes and seconds; every memory figure printed for a
person is GiB (2^30 bytes), the unit nvidia-smi, PyTorch's memory reports and GPU capacities
(80 GiB on an "80 GB" H100) use, never a mix of GB and GiB."""

from __future__ import annotations

GIB = 2**30


def gib(value_bytes: float, digits: int = 1) -> str:
    """``value_bytes`` in GiB, without the unit (table cells): ``gib(80 * 2**30) == "80.0"``."""
    return f"{value_bytes / GIB:.{digits}f}"


def gib_text(value_bytes: float, digits: int = 1) -> str:
    """``value_bytes`` in GiB with the unit, for sentences: ``"80.0 GiB"``."""
    return f"{gib(value_bytes, digits)} GiB"
