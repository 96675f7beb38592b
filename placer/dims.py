"""The one vocabulary of parallel dimensions, process groups and communication parts.

Every module names a dimension, a group or a part of the step through these enums, never a
string of its own (torchtitan names its mesh axes the same way, ``MeshAxisName``). They are
``str`` subclasses, so they compare equal to, hash like and print as their spelling
(``Dim.TP == "tp"``): files placer reads and writes keep the same text.

- ``Dim``: a degree of a ``Layout`` (its field names), dense or expert.
- ``Group``: a process group a collective runs on, as the rank map names it. ``DP_CP`` is the
  dense gradient and ZeRO shard group (dp x cp ranks, Megatron-Core's
  ``get_data_parallel_group(with_context_parallel=True)``); ``EDP`` the expert data-parallel one.
- ``Part``: the part of the step breakdown a collective is charged to (its ``_exposed_s`` field).
"""

from __future__ import annotations

from enum import Enum


class _Name(str, Enum):
    """A name that is its own spelling in text, JSON and f-strings (Python 3.10's StrEnum)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Dim(_Name):
    """A parallel degree of a layout, named as the ``Layout`` field is."""

    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"
    EP = "ep"
    ETP = "etp"
    EDP = "edp"


class Group(_Name):
    """A process group, named as ``rankmap.json`` names it; see the module docstring."""

    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"
    DP_CP = "dp_cp"
    EP = "ep"
    ETP = "etp"
    EDP = "edp"

    @property
    def dims(self) -> tuple[Dim, ...]:
        """The degrees whose ranks the group spans (``DP_CP``: dp and cp)."""
        return tuple(Dim(name) for name in self.value.split("_"))

    @property
    def expert(self) -> bool:
        """A group of the expert grid (etp x ep x edp within a stage)."""
        return self in EXPERT_GROUPS


class Part(_Name):
    """What issues a collective: the step-breakdown part its exposed time is charged to."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    PP = "pp"
    DP = "dp"
    ZERO = "zero"


DENSE_DIMS: tuple[Dim, ...] = (Dim.TP, Dim.CP, Dim.DP, Dim.PP)
"""The dense grid's degrees; their product is the GPU count."""
EXPERT_DIMS: tuple[Dim, ...] = (Dim.ETP, Dim.EP, Dim.EDP)
"""The expert grid's degrees within a stage, innermost first (Megatron-Core's expert generator)."""
DEFAULT_ORDER: tuple[Dim, ...] = (Dim.TP, Dim.CP, Dim.DP, Dim.PP)
"""Megatron's default mesh order ``tp-cp-dp-pp``, innermost first."""
GROUPS: tuple[Group, ...] = (Group.TP, Group.CP, Group.DP, Group.PP, Group.DP_CP, Group.EP,
                             Group.ETP, Group.EDP)
"""Every group the rank map lists, in its order."""
EXPERT_GROUPS: frozenset[Group] = frozenset({Group.ETP, Group.EP, Group.EDP})
PRICED_GROUPS: tuple[Group, ...] = (Group.TP, Group.CP, Group.PP, Group.DP_CP, Group.EP,
                                    Group.ETP, Group.EDP)
"""The groups the cost model prices (dp alone is never a collective's group: gradients reduce
over dp x cp)."""
PART_ORDER: tuple[Part, ...] = (Part.TP, Part.CP, Part.EP, Part.PP, Part.DP, Part.ZERO)
"""The order of the collectives table and the breakdown."""
PART_GROUP: dict[Part, Group] = {Part.TP: Group.TP, Part.CP: Group.CP, Part.EP: Group.EP,
                                 Part.PP: Group.PP, Part.DP: Group.DP_CP, Part.ZERO: Group.DP_CP}
"""The dense group each part's collectives run on (expert gradients: ``Group.EDP`` instead)."""
LAYOUT_DIMS: tuple[Dim, ...] = (Dim.TP, Dim.PP, Dim.DP, Dim.CP, Dim.EP, Dim.ETP)
"""The degrees a ``Layout`` sets; edp follows from them."""
