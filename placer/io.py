"""Writing placer's output: whole files and whole folders or nothing, and never over a file
unasked.

Everything is first written to a temporary file or folder next to its target (the same file
system), then renamed into place: a new folder appears in one rename; into an existing one each
file is moved with an atomic ``os.replace`` (``move_into_place``), and a failure part-way puts
back every file already replaced. A file already there is replaced only with ``force``
(``--force``); otherwise the call fails before anything is written, with one message
(``already_exists``) for every command.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from placer.errors import PlacerError


@dataclass(frozen=True)
class OutputFile:
    """One file to write: a plain name (no directories), its text and its permission bits."""

    name: str
    text: str
    mode: int = 0o644


Producer = Callable[[Path], list[Path]]
"""Writes files into the folder it is given and returns the paths it wrote."""


def already_exists(path: Path, option: str = "", names: Sequence[str] = ()) -> PlacerError:
    """The one refusal to replace output without ``--force``: ``path`` exists (or, as a folder,
    already holds ``names``)."""
    where = f"{option}: {path}" if option else str(path)
    what = f"already has {', '.join(names)}" if names else "already exists"
    them = "them" if len(names) > 1 else "it"
    return PlacerError(f"{where} {what}; pass --force to replace {them}, or choose another path")


def refuse_existing(force: bool, **paths: Path | None) -> None:
    """Before any work: each output file's folder must exist and take a new file, and files a
    command would replace need ``--force`` (options by keyword, ``save_profile`` for
    ``--save-profile``), so a long run does not end in a refusal to write its result."""
    for option, path in paths.items():
        if path is None:
            continue
        flag = f"--{option.replace('_', '-')}"
        if not path.parent.is_dir():
            raise PlacerError(f"{flag}: folder {path.parent} does not exist")
        if path.is_dir():
            raise _folder_in_the_way(path, flag)
        _probe_writable(path.parent, flag)
        if path.exists() and not force:
            raise already_exists(path, flag)


def _folder_in_the_way(path: Path, option: str) -> PlacerError:
    return PlacerError(f"{option}: cannot write {path}: it is a folder; give a file name")


def _probe_writable(folder: Path, flag: str) -> None:
    """Make and remove a temporary folder in ``folder``: what writing output will do there
    (permission bits alone say nothing for root or a read-only file system)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".placer-probe.", dir=folder))
    except OSError as exc:
        raise PlacerError(f"{flag}: cannot write in {folder} ({exc.strerror or exc}); choose "
                          "another folder") from None


def refuse_nonempty_folders(force: bool, **folders: Path | None) -> None:
    """Before any work: an output folder (options by keyword) must be a folder that can be
    made or written, and without ``force`` empty or new, so a command that would refuse to
    write its files fails before a long search, not after it."""
    for option, folder in folders.items():
        if folder is None:
            continue
        flag = f"--{option.replace('_', '-')}"
        if folder.exists() and not folder.is_dir():
            raise PlacerError(f"{flag}: {folder} exists and is not a folder")
        existing = folder if folder.exists() else next(
            p for p in folder.absolute().parents if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise PlacerError(f"{flag}: cannot write in {existing}; choose another folder")
        _probe_writable(existing, flag)
        if folder.is_dir() and not force:
            names = sorted(p.name for p in folder.iterdir())
            if names:
                shown = names[:3] + ([f"{len(names) - 3} more"] if len(names) > 3 else [])
                raise already_exists(folder, flag, shown)


def write_text(path: Path, text: str, option: str, force: bool = True) -> None:
    """Write ``text`` to ``path`` whole or not at all: a temporary file beside it, renamed into
    place, and removed if anything fails (an interrupt included). Refuses to replace an existing
    file unless ``force``."""
    if not path.parent.is_dir():
        raise PlacerError(f"{option}: folder {path.parent} does not exist")
    if path.is_dir():
        raise _folder_in_the_way(path, option)
    if path.exists() and not force:
        raise already_exists(path, option)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise PlacerError(f"{option}: cannot write {path}: {exc.strerror or exc}") from None
    tmp = Path(name)
    try:
        with open(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp's 0600 would hide the file from the user's group
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PlacerError(f"{option}: cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _check_names(files: list[OutputFile]) -> None:
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate output names in {names}")
    for name in names:
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise ValueError(f"output name {name!r} must be a plain file name")


def write_files(out_dir: Path, files: list[OutputFile], force: bool = False,
                option: str = "--out") -> list[Path]:
    """Write ``files`` into ``out_dir``; return their paths in the order given.

    Raises PlacerError (nothing written) when ``out_dir`` is not a directory, or when any of the
    files exists and ``force`` is false.
    """
    _check_names(files)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise PlacerError(f"{option}: {out_dir} exists and is not a directory")
    targets = [out_dir / f.name for f in files]
    if not force:
        existing = [t.name for t in targets if t.exists() or t.is_symlink()]
        if existing:
            raise already_exists(out_dir, option, existing)
    for target in targets:
        if target.is_dir() and not target.is_symlink():
            raise PlacerError(f"{option}: {target} is a directory; remove it or choose another "
                              "output directory")
    parent = out_dir.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise PlacerError(f"{option}: cannot write in {parent}: {exc.strerror or exc}") from None
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
        raise PlacerError(f"{option}: writing {out_dir} failed: {exc.strerror or exc}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return targets


def write_folders(jobs: list[tuple[Path, Producer]], *, force: bool = False) -> list[Path]:
    """Run each producer into a staging folder, then move all results into place.

    Only when every folder has been produced without error, and no file would be overwritten
    unasked, are the files moved; an error leaves no half-written output (not even an empty
    folder). Returns the final paths, folder by folder, in the producers' order.
    """
    with _stage_all([out for out, _ in jobs]) as stages:
        staged: list[tuple[Path, Path, list[Path]]] = []
        for (out_dir, produce), stage in zip(jobs, stages, strict=True):
            if out_dir.exists() and not out_dir.is_dir():
                raise PlacerError(f"{out_dir}: exists and is not a folder")
            written = [p.relative_to(stage) for p in produce(stage)]
            staged.append((out_dir, stage, written))
        claimed: set[Path] = set()
        for out_dir, _, written in staged:
            for rel in written:
                target = (out_dir / rel).absolute()
                if target in claimed:
                    raise PlacerError(f"{out_dir / rel}: written twice; use different folders")
                claimed.add(target)
                if target.exists() and not force:
                    raise already_exists(out_dir / rel)
        moves = [(stage / rel, out_dir / rel) for out_dir, stage, written in staged
                 for rel in written]
        try:
            move_into_place(moves)
        except OSError as exc:
            raise PlacerError(f"cannot write {exc.filename or 'output'}: "
                              f"{exc.strerror or exc}") from None
        return [target for _, target in moves]


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


@contextmanager
def _staging(out_dir: Path) -> Iterator[Path]:
    """A hidden folder in ``out_dir``, or in the nearest existing folder above it: the same file
    system, so the files can be renamed into place."""
    folder = out_dir.absolute()
    anchor = next(p for p in (folder, *folder.parents) if p.is_dir())
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".placer-{out_dir.name}-", dir=anchor))
    except OSError as exc:
        raise PlacerError(f"cannot write in {anchor}: {exc.strerror or exc}") from None
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def _stage_all(out_dirs: list[Path]) -> Iterator[list[Path]]:
    with ExitStack() as stack:
        yield [stack.enter_context(_staging(out)) for out in out_dirs]


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
