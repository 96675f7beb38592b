"""Live tensor bytes on CPU, where PyTorch keeps no allocator statistics.

A ``TorchDispatchMode`` sees every tensor an operator creates (forward, backward and optimizer
alike; on CPU the autograd engine runs backward on the calling thread, so the mode is active
there too). Each new storage is counted once, until Python frees it (storages keep one Python
object while alive, so a weak reference fires when the storage goes). ``resize_`` of a storage,
which FSDP2 uses to free and refill unsharded parameters, is followed too. The peak of the
running sum is what a GPU's ``max_memory_allocated`` would report for the same tensors (without
the CUDA context, NCCL buffers and the caching allocator's rounding and fragmentation).

With ``limit_bytes`` (the planned GPU's memory) an allocation past it raises
``torch.OutOfMemoryError`` as the CUDA allocator would, so running out of memory is exercised
on CPU too.

For DTensors the local shard is counted (what the rank holds). Tensors made inside a DTensor
operator's own dispatch (its temporary redistributions) are not seen, only its result.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _local(tensor: torch.Tensor) -> torch.Tensor:
    inner = getattr(tensor, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else tensor


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live storages made while active; ``peak_bytes`` is the high mark."""

    def __init__(self, limit_bytes: int | None = None) -> None:
        super().__init__()
        self.limit_bytes = limit_bytes
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}
        self._original_resize: Callable[..., Any] | None = None
        self.active = False

    def _add(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        if key in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[key] = size
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._drop, key)
        if self.limit_bytes is not None and self.live_bytes > self.limit_bytes:
            raise torch.OutOfMemoryError(
                f"live tensors reached {self.live_bytes} bytes, more than the emulated device's "
                f"{self.limit_bytes}")

    def _drop(self, key: int) -> None:
        self.live_bytes -= self._sizes.pop(key, 0)

    def track(self, tensor: torch.Tensor) -> None:
        """Count a tensor made before the mode was entered (its storage, once)."""
        local = _local(tensor)
        if local.device.type != "meta":
            self._add(local.untyped_storage())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self.track(value)
        return out

    def __enter__(self) -> LiveBytes:
        original = torch.UntypedStorage.resize_
        self._original_resize = original
        sizes = self._sizes

        def resize(storage: torch.UntypedStorage, size: int) -> Any:
            result = original(storage, size)
            key = id(storage)
            if key in sizes:
                self.live_bytes += storage.nbytes() - sizes[key]
                sizes[key] = storage.nbytes()
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            return result

        torch.UntypedStorage.resize_ = resize  # type: ignore[method-assign]
        super().__enter__()
        self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = False
        super().__exit__(*exc)
        if self._original_resize is not None:
            torch.UntypedStorage.resize_ = self._original_resize  # type: ignore[method-assign]
