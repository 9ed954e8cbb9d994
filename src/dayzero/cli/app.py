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

