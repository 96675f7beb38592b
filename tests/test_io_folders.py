"""--emit and --plot folders are written all or nothing (placer.io.write_folders)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from placer.errors import PlacerError
from placer.io import refuse_existing, refuse_nonempty_folders, write_folders, write_text


def writer(*names: str) -> Callable[[Path], list[Path]]:
    def produce(stage: Path) -> list[Path]:
        paths = []
        for name in names:
            path = stage / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"content of {name}\n")
            paths.append(path)
        return paths

    return produce


def failing(stage: Path) -> list[Path]:
    (stage / "partial.txt").write_text("half")
    raise PlacerError("the producer failed")


def test_folders_are_created_with_every_file(tmp_path: Path) -> None:
    emit, plot = tmp_path / "out" / "emit", tmp_path / "plots"
    paths = write_folders([(emit, writer("plan.json", "sub/launch.sh")),
                           (plot, writer("rankmap.png"))])
    assert paths == [emit / "plan.json", emit / "sub" / "launch.sh", plot / "rankmap.png"]
    assert (emit / "sub" / "launch.sh").read_text() == "content of sub/launch.sh\n"


def test_a_failing_producer_leaves_nothing_behind(tmp_path: Path) -> None:
    emit, plot = tmp_path / "new" / "emit", tmp_path / "plots"
    with pytest.raises(PlacerError, match="the producer failed"):
        write_folders([(emit, writer("plan.json")), (plot, failing)])
    assert list(tmp_path.iterdir()) == []


def test_existing_files_need_force_and_block_every_folder(tmp_path: Path) -> None:
    emit, plot = tmp_path / "emit", tmp_path / "plots"
    plot.mkdir()
    (plot / "rankmap.png").write_text("old")
    with pytest.raises(PlacerError) as err:
        write_folders([(emit, writer("plan.json")), (plot, writer("rankmap.png"))])
    assert "rankmap.png already exists; pass --force" in str(err.value)
    assert not emit.exists() and (plot / "rankmap.png").read_text() == "old"
    write_folders([(emit, writer("plan.json")), (plot, writer("rankmap.png"))], force=True)
    assert (plot / "rankmap.png").read_text() == "content of rankmap.png\n"


def test_one_folder_for_both_outputs_is_fine_unless_names_clash(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_folders([(out, writer("plan.json")), (out, writer("rankmap.png"))])
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "rankmap.png"]
    with pytest.raises(PlacerError, match="written twice"):
        write_folders([(tmp_path / "x", writer("a")), (tmp_path / "x", writer("a"))], force=True)


def test_a_file_where_the_folder_should_be_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    with pytest.raises(PlacerError, match="is not a folder"):
        write_folders([(tmp_path / "taken", writer("plan.json"))])


def test_output_files_are_checked_before_any_work(tmp_path: Path) -> None:
    """refuse_existing: what writing the result would hit, said before the run, not after it."""
    (tmp_path / "a.yaml").write_text("x\n")
    with pytest.raises(PlacerError, match=r"^--out: folder .*missing does not exist$"):
        refuse_existing(False, out=tmp_path / "missing" / "p.yaml")
    with pytest.raises(PlacerError, match="--out: cannot write .*: it is a folder"):
        refuse_existing(True, out=tmp_path)
    with pytest.raises(PlacerError, match="--save-profile: .*a.yaml already exists; pass --force"):
        refuse_existing(False, save_profile=tmp_path / "a.yaml")
    refuse_existing(True, out=tmp_path / "a.yaml")
    refuse_existing(False, out=tmp_path / "new.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml"]  # the probe leaves nothing


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_folder_that_refuses_new_entries_fails_early_even_for_root() -> None:
    # /proc takes no new folders whatever the permission bits say (root passes os.access)
    with pytest.raises(PlacerError, match=r"^--out: cannot write in /proc \("):
        refuse_existing(False, out=Path("/proc/placer-profile.yaml"))
    with pytest.raises(PlacerError, match=r"^--emit: cannot write in /proc"):
        refuse_nonempty_folders(False, emit=Path("/proc/placer-out/launch"))


def test_write_text_over_a_folder_says_so_even_with_force(tmp_path: Path) -> None:
    with pytest.raises(PlacerError, match="--out: cannot write .*: it is a folder; give a file"):
        write_text(tmp_path, "x\n", "--out", force=True)
