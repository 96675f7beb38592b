"""The ``placer`` command: thin click commands that wire specs, solver, launch and verify.

Each command lives in its own module below; this one owns the group and the error contract:
user errors print one ``error:`` line and exit with code 2, never a traceback.
"""

from __future__ import annotations

import gc
import importlib
import sys

import click

from placer import __version__
from placer.errors import USER_ERROR_EXIT_CODE, PlacerError

COMMAND_MODULES = {
    "presets": "spec_commands", "schema": "spec_commands",
    "recommend-layout": "recommend_command", "estimate": "estimate_command",
    "launch": "launch_command", "check": "check_command", "topology": "topology_command",
    "calibrate": "verify_command", "verify": "verify_command", "init": "init_command",
}
"""Which module of placer/cli defines each command. A command imports only its own module, so
``placer check`` never loads the solver (ortools alone takes ~0.5 s) and ``placer presets``
loads neither. A module whose commands are missing here is still found: an unknown name
imports every module listed in ``_register`` before click says it does not exist."""


class _LazyGroup(click.Group):
    """A click group that imports a command's module only when that command runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        _load_all()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            module = COMMAND_MODULES.get(cmd_name)
            if module is not None:
                _add_commands(module)
            if cmd_name not in self.commands:
                _load_all()
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="placer")
def cli() -> None:
    """Recommend parallel layouts and rank placement for large-model training."""


_MODULES: tuple[str, ...] = ()
_PROCESS_ENTRY = False
"""Whether ``main`` runs as the process's entry point (``argv`` None), not in process."""


def _add_commands(module_name: str) -> None:
    module = importlib.import_module(f"placer.cli.{module_name}")
    for command in module.COMMANDS:
        if command.name not in cli.commands:
            cli.add_command(command)


def _load_all() -> None:
    for module_name in _MODULES:
        _add_commands(module_name)


def _register() -> None:
    """Name the command modules (imported when one of their commands is asked for)."""
    global _MODULES
    _MODULES = ("spec_commands", "recommend_command", "estimate_command", "launch_command",
                "check_command", "topology_command", "verify_command", "init_command")


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the group, mapping every user error to one line and exit 2.

    Run as the process's own entry point (``argv`` None), it freezes the heap before exiting
    (``_exit_frozen``), and a command may turn the cyclic collector off (``collector_off``)."""
    global _PROCESS_ENTRY
    _PROCESS_ENTRY = argv is None
    _register()
    try:
        try:
            code = cli.main(args=argv, prog_name="placer", standalone_mode=False)
        finally:
            if argv is None:
                _exit_frozen()
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


def collector_off() -> None:
    """Turn the cyclic garbage collector off for the rest of this process, where ``main`` is
    the process's entry point (in process, as tests run commands, nothing changes).

    For recommend-layout, whose search allocates hundreds of thousands of small objects and
    keeps most of them in its caches, so that each collection of the older generations walks
    them again: in process (bench conditions, load ~4) the collector took 14 % of DeepSeek-V3's
    main search (2,048 H100) and 22 % of a what-if's, 8 % and 21 % on GPT-3 175B / 1,024 A100;
    off, the fresh command's CPU went 3.20 -> 2.92 s (GPT-3, 3 runs alternated) and ~11.1 ->
    ~8.8 s (DeepSeek-V3, 2 runs) with the same peak memory (63 / 140 MB): the search makes no
    reference cycles worth collecting. The forked what-if children inherit the setting."""
    if _PROCESS_ENTRY:
        gc.disable()


def _exit_frozen() -> None:
    """Move every object into the collector's permanent generation (``gc.freeze``) as the
    process is about to exit, so that the interpreter's final collection does not walk the
    search's caches: recommend-layout's last ~0.2 s (GPT-3 175B / 1,024 A100) to ~0.55 s
    (DeepSeek-V3 / 2,048 H100) went to that collection after the output was complete. Objects
    are still freed, atexit handlers and non-daemon threads still run; only cycles found at
    exit are left to the OS. Not in process (tests pass ``argv``): a frozen heap there would
    keep every later cycle."""
    gc.freeze()
