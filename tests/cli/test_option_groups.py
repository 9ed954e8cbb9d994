"""Option groups (dayzero.cli.option_groups): a group's fields become the verb's flags in place, with
their names, defaults and help, and reach the verb as one instance."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Optional

import pytest
import typer
from typer.testing import CliRunner

from dayzero.cli.option_groups import takes_groups


@dataclass(frozen=True)
class Sizes:
    """Two flags of one group."""

    width: Annotated[int, typer.Option("--width", "-w", min=1, help="How wide.")] = 3
    label: Annotated[Optional[str], typer.Option("--label", help="What to call it.")] = None


def _app():
    app = typer.Typer()
    seen = {}

    @app.command()
    @takes_groups(sizes=Sizes)
    def verb(name: Annotated[str, typer.Argument()], sizes: Sizes = Sizes(),
             loud: Annotated[bool, typer.Option("--loud")] = False) -> None:
        seen.update(name=name, sizes=sizes, loud=loud)

    return app, verb, seen


def test_the_fields_take_the_group_parameter_place_in_order():
    _, verb, _ = _app()
    params = list(inspect.signature(verb).parameters)
    assert params == ["name", "width", "label", "loud"]


def test_the_verb_receives_one_instance_with_the_flags_given():
    app, _, seen = _app()
    result = CliRunner().invoke(app, ["model", "-w", "5", "--loud"])
    assert result.exit_code == 0, result.output
    assert seen == {"name": "model", "sizes": Sizes(width=5), "loud": True}
    CliRunner().invoke(app, ["model"])
    assert seen["sizes"] == Sizes()


def test_the_group_flags_keep_their_checks_and_help():
    app, _, _ = _app()
    bad = CliRunner().invoke(app, ["model", "--width", "0"])
    assert bad.exit_code == 2
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "--width" in shown and "-w" in shown and "How wide." in shown and "What to call it." in shown


def test_a_group_without_its_parameter_is_refused():
    with pytest.raises(TypeError, match="no parameter sizes"):
        @takes_groups(sizes=Sizes)
        def verb(name: str) -> None:
            pass
