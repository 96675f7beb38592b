"""The ``placer`` command: thin click commands that wire specs, solver, launch and verify.

Each command lives in its own module below; this one owns the group and the error contract:
user errors print one ``error:`` line and exit with code 2, never a traceback.
"""

from __future__ import annotations

import sys

import click

from placer import __version__
from placer.errors import USER_ERROR_EXIT_CODE, PlacerError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="placer")
def cli() -> None:
    """Recommend parallel layouts and rank placement for large-model training."""


def _register() -> None:
    from placer.cli import (
        check_command,
        estimate_command,
        launch_command,
        recommend_command,
        spec_commands,
        topology_command,
        verify_command,
    )

    for module in (spec_commands, recommend_command, estimate_command, launch_command,
                   check_command, topology_command, verify_command):
        for command in module.COMMANDS:
            cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the group, mapping every user error to one line and exit 2."""
    _register()
    try:
        code = cli.main(args=argv, prog_name="placer", standalone_mode=False)
    except PlacerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(USER_ERROR_EXIT_CODE)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(USER_ERROR_EXIT_CODE)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        command = ctx.command_path if ctx is not None else "placer"
        hint = f" (see '{command} --help')"
        message = " ".join(exc.format_message().split())
        click.echo(f"error: {message}{hint}", err=True)
        sys.exit(USER_ERROR_EXIT_CODE)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
