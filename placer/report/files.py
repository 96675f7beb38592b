"""Writing output folders all or nothing.

Each folder's files are first written into a private temporary folder on the same file system;
only when every folder has been produced without error, and no file would be overwritten unasked,
are the files moved into place, each in one atomic rename, and a failure part-way puts back what
was there (``placer.launch.writer.move_into_place``). An error therefore leaves no half-written
output (not even an empty folder), and a file already there is replaced only with ``force``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from placer.errors import PlacerError
from placer.launch.writer import move_into_place

Producer = Callable[[Path], list[Path]]


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


def write_folders(jobs: list[tuple[Path, Producer]], *, force: bool = False) -> list[Path]:
    """Run each producer into a staging folder, then move all results into place.

    A producer writes into the folder it is given and returns the paths it wrote. Returns the
    final paths, folder by folder, in the producers' order.
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
                    raise PlacerError(f"{out_dir / rel}: already exists; pass --force to "
                                      f"overwrite it")
        moves = [(stage / rel, out_dir / rel) for out_dir, stage, written in staged
                 for rel in written]
        try:
            move_into_place(moves)
        except OSError as exc:
            raise PlacerError(f"cannot write {exc.filename or 'output'}: "
                              f"{exc.strerror or exc}") from None
        return [target for _, target in moves]


@contextmanager
def _stage_all(out_dirs: list[Path]) -> Iterator[list[Path]]:
    with ExitStack() as stack:
        yield [stack.enter_context(_staging(out)) for out in out_dirs]
