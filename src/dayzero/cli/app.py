"""The typer app and its entry point.

Each verb lives in its own module under ``dayzero.cli`` and registers itself on ``app``; add a
verb by adding its module name to ``VERBS``. Verb modules import only light code at top level
(specs, typer, rich) so that ``dayzero inspect`` stays instant; heavy imports (torch, numpy
search) happen inside the command functions. Every command's ``--help`` is rendered by
:mod:`dayzero.cli.help`.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

from dayzero.cli.help import HelpCommand, HelpGroup
from dayzero.errors import DayzeroError
from dayzero.runtime.resilience.stopping import Interrupted, StopOnSignal

app = typer.Typer(
    name="dayzero",
    help="Day-0 adaptation of giant LLMs to an accelerator cluster: analyse, plan, train, operate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    cls=HelpGroup,
)

VERBS = ["day0", "models", "hardware", "inspect", "ops", "memory", "predict", "plan", "compare", "backtest", "train",
         "ckpt", "calibrate", "validate", "export", "moe"]


def package_version() -> str:
    """The installed distribution's version, else the source tree's ``dayzero.__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dayzero")
    except PackageNotFoundError:
        import dayzero

        return getattr(dayzero, "__version__", "unknown")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dayzero {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                               help="Print the version and exit.")] = False) -> None:
    """Day-0 adaptation of giant LLMs to an accelerator cluster: analyse, plan, train, operate."""


for _verb in VERBS:
    importlib.import_module(f"dayzero.cli.{_verb}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def numbers_checked(callback):
    """The verb ``callback`` with every numeric flag checked first, by one rule for all verbs: a
    number must be finite (click parses 'nan' and 'inf' as floats) and not negative (no dayzero
    flag has a meaning below zero; sizes that must be positive declare ``min=1`` themselves). A
    bad value is one line and exit 2, before any work starts."""
    import functools
    import math

    @functools.wraps(callback)
    def run(*args, **kwargs):
        for name, value in kwargs.items():
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                if isinstance(v, float) and not math.isfinite(v):
                    raise typer.BadParameter(f"{v} is not a finite number", param_hint=_flag(name))
                if v < 0:
                    raise typer.BadParameter(f"{v} is negative; dayzero's numeric flags are >= 0",
                                             param_hint=_flag(name))
        return callback(*args, **kwargs)

    return run


def _check_every_verb(typer_app: typer.Typer) -> None:
    for info in typer_app.registered_commands:
        info.callback = numbers_checked(info.callback)
    for group in typer_app.registered_groups:
        _check_every_verb(group.typer_instance)


_check_every_verb(app)


def _use_house_help(t: typer.Typer) -> None:
    """Every command and group of ``t`` renders --help with dayzero.cli.help (set here, once,
    rather than in every verb's decorator)."""
    from typer.core import TyperCommand

    for info in t.registered_commands:
        if info.cls in (None, TyperCommand):  # typer's default; a verb's own class is kept
            info.cls = HelpCommand
    for group in t.registered_groups:
        group.cls = HelpGroup
        _use_house_help(group.typer_instance)


_use_house_help(app)


def _no_args_help_errors() -> tuple[type, ...]:
    """click's 'no arguments: show help' exception: its help is the message, not an error."""
    found = []
    for module, name in (("click.exceptions", "NoArgsIsHelp"), ("typer._click.exceptions", "NoArgsIsHelpError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: user errors become one line on stderr and exit code 2; SIGINT
    and SIGTERM one line and 128 + the signal."""
    try:
        # with standalone_mode=False click returns (not raises) the code of a typer.Exit
        with StopOnSignal():
            rv = app(args=argv, standalone_mode=False)
    except DayzeroError as e:
        print(f"dayzero: error: {e}", file=sys.stderr)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        print("dayzero: aborted", file=sys.stderr)
        return 130
    except Interrupted as e:  # a stop signal (dayzero.runtime.resilience.stopping): 128 + its number
        print(f"dayzero: {e.describe()}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("dayzero: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a path the user gave that cannot be read or written, found late
        if e.filename is None:
            raise
        print(f"dayzero: error: {e.filename}: {e.strerror or e}; check the path and its permissions", file=sys.stderr)
        return 2
    except Exception as e:  # click usage errors and friends
        import click

        if isinstance(e, _no_args_help_errors()):  # bare `dayzero` or `dayzero ckpt`: help, exit 0
            if e.format_message():
                print(e.format_message())
            return 0

        # typer >= 0.26 vendors click: its usage errors derive from typer.TyperException, not click's
        if isinstance(e, (click.ClickException, typer.TyperException)) and hasattr(e, "format_message"):
            print(f"dayzero: error: {e.format_message()}", file=sys.stderr)
            return 2
        raise
    return rv if isinstance(rv, int) else 0

