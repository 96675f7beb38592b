"""Write a set of generated files all-or-nothing: no half-written output, nothing clobbered.

Everything is first written to a temporary directory next to the output directory (same file
system), then renamed into place: a new output directory appears in one rename; into an existing
one each file is moved with an atomic ``os.replace``. Existing files are replaced only with
``force``; otherwise the call fails before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from placer.errors import PlacerError


@dataclass(frozen=True)
class OutputFile:
    """One file to write: a plain name (no directories), its text and its permission bits."""

    name: str
    text: str
    mode: int = 0o644


def _check_names(files: list[OutputFile]) -> None:
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate output names in {names}")
    for name in names:
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise ValueError(f"output name {name!r} must be a plain file name")


def write_files(out_dir: Path, files: list[OutputFile], force: bool = False) -> list[Path]:
    """Write ``files`` into ``out_dir``; return their paths in the order given.

    Raises PlacerError (nothing written) when ``out_dir`` is not a directory, or when any of the
    files exists and ``force`` is false.
    """
    _check_names(files)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise PlacerError(f"--out: {out_dir} exists and is not a directory")
    targets = [out_dir / f.name for f in files]
    if not force:
        existing = [t.name for t in targets if t.exists() or t.is_symlink()]
        if existing:
            raise PlacerError(f"--out: {out_dir} already has {', '.join(existing)}; "
                              "pass --force to replace them, or choose another directory")
    for target in targets:
        if target.is_dir() and not target.is_symlink():
            raise PlacerError(f"--out: {target} is a directory; remove it or choose another "
                              "output directory")
    parent = out_dir.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise PlacerError(f"--out: cannot write in {parent}: {exc.strerror or exc}") from None
    try:
        for f in files:
            _write_synced(staging / f.name, f.text, f.mode)
        if out_dir.exists():
            for f, target in zip(files, targets, strict=True):
                os.replace(staging / f.name, target)
        else:
            os.chmod(staging, 0o755)  # mkdtemp makes it 0700
            os.rename(staging, out_dir)
        _fsync_dir(out_dir)
        _fsync_dir(parent)
    except OSError as exc:
        raise PlacerError(f"--out: writing {out_dir} failed: {exc.strerror or exc}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return targets


def _write_synced(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(path, mode)  # the umask must not strip the executable bit


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
