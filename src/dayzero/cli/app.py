"""The typer app and its entry point.

Each verb lives in its own module under ``dayzero.cli`` and registers itself on ``app``; add a
verb by adding its module name to ``VERBS``. Verb modules import only light code at top level
(specs, typer, rich) so that ``dayzero inspect`` stays instant; heavy imports (torch, numpy
search) happen inside the command functions.
"""

from __future__ import annotations

import importlib
import sys

import typer

from dayzero.errors import DayzeroError
from dayzero.runtime.stopping import Interrupted, StopOnSignal

app = typer.Typer(
    name="dayzero",
    help="Day-0 adaptation of giant LLMs to an accelerator cluster: analyse, plan, train, operate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

VERBS = ["models", "hardware", "inspect", "ops", "memory", "predict", "plan", "backtest", "train", "ckpt",
         "calibrate", "validate"]

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
    except Interrupted as e:  # a stop signal (dayzero.runtime.stopping): 128 + its number
        print(f"dayzero: {e.describe()}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("dayzero: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # click usage errors and friends
        import click

        # typer >= 0.26 vendors click: its usage errors derive from typer.TyperException, not click's
        if isinstance(e, (click.ClickException, typer.TyperException)) and hasattr(e, "format_message"):
            print(f"dayzero: error: {e.format_message()}", file=sys.stderr)
            return 2
        raise
    return rv if isinstance(rv, int) else 0

