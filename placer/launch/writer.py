"""Write a set of generated files all-or-nothing: no half-written output, nothing clobbered.

Everything is first written to a temporary directory next to the output directory (same file
system), then renamed into place: a new output directory appears in one rename; into an existing
one each file is moved with an atomic ``os.replace`` (``move_into_place``), and a failure part-way
puts back every file already replaced. Existing files are replaced only with ``force``; otherwise
the call fails before anything is written.
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
            move_into_place([(staging / f.name, t) for f, t in zip(files, targets, strict=True)])
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


def move_into_place(moves: list[tuple[Path, Path]]) -> None:
    """Move staged files onto their targets, all or nothing.

    Each source must sit on its target's file system (a staging folder next to the output), so
    every move is an atomic ``os.replace`` and no target is ever half-written. Before a file is
    replaced it is hard-linked (or, where links are not supported, copied) next to its source;
    if a later move fails, the files already moved are put back, new ones and the folders made
    for them removed, and the error is raised.
    """
    done: list[tuple[Path, Path | None]] = []
    made: list[Path] = []
    try:
        for index, (source, target) in enumerate(moves):
            backup = None
            if target.exists() or target.is_symlink():
                backup = source.with_name(f".placer-backup-{index}")
                _keep(target, backup)
            _make_parents(target, made)
            os.replace(source, target)
            done.append((target, backup))
    except OSError:
        for target, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is None:
                    target.unlink()
                else:
                    os.replace(backup, target)
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _keep(target: Path, backup: Path) -> None:
    try:
        os.link(target, backup, follow_symlinks=False)
    except OSError:
        shutil.copy2(target, backup, follow_symlinks=False)


def _make_parents(target: Path, made: list[Path]) -> None:
    missing = [p for p in target.parents if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir()
        made.append(folder)


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
