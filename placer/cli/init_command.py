"""``placer init cluster|model|job``: write a commented example of an input file to edit.

Each example lists the fields a newcomer needs, with their units and choices, and loads as it
is (tests/test_init_command.py validates every one with the pydantic models), so a custom
cluster starts from a file that works instead of from one error per missing field.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import click

KINDS = ("cluster", "model", "job")
USE = {"cluster": "--cluster {path}", "model": "--model {path}", "job": "--job {path}"}


def example_text(kind: str) -> str:
    """The commented example file of one input kind."""
    folder = resources.files("placer.spec").joinpath("presets", "examples")
    return folder.joinpath(f"{kind}.yaml").read_text(encoding="utf-8")


@click.command("init")
@click.argument("kind", type=click.Choice(KINDS, case_sensitive=False))
@click.option("--out", "out_path", type=click.Path(path_type=Path), metavar="FILE",
              help="where to write it  [default: KIND.yaml here]")
@click.option("--force", is_flag=True, help="replace FILE if it exists")
def init_command(kind: str, out_path: Path | None, force: bool) -> None:
    """Write a commented example cluster, model or job file to edit.

    Example: placer init cluster --out my-cluster.yaml
    """
    from placer.io import write_text

    path = out_path or Path(f"{kind}.yaml")
    write_text(path, example_text(kind), "--out", force=force)
    click.echo(f"wrote {path}: edit it, then pass {USE[kind].format(path=path)}", err=True)


COMMANDS = [init_command]
