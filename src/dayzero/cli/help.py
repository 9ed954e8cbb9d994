"""``--help`` for every verb: usage, the docstring, and arguments, options and commands as
:class:`~dayzero.cli.render.FitTable` s, so help fits 80 columns as every other output does.

typer's own rich help puts each option's long name, its negative form and a ``<type>`` in
columns of their own, which at 80 columns cuts names (``--sequence-paral…``) and squeezes the
help text to a sliver. Here an option is one cell that never wraps (``--seq INT``; ``--sequence-parallel /``
over ``--no-sequence-parallel``), flags show no type (they take no value) and valued options a plain
metavar. Docstrings keep rich markup ([bold]); option help is plain text.
"""

from __future__ import annotations

import inspect

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from dayzero.cli.render import FitTable

# type names (click's, or typer's annotation names) -> metavar shown after a valued option
_METAVARS = {"integer": "INT", "int": "INT", "integer range": "INT", "float": "FLOAT", "float range": "FLOAT",
             "text": "TEXT", "str": "TEXT", "path": "PATH", "Path": "PATH", "filename": "FILE"}


def metavar(param) -> str:
    """What follows a valued option in help: its own metavar, else the value's type in capitals."""
    if param.metavar:
        return param.metavar
    ptype = getattr(param, "type", None)
    name = getattr(ptype, "name", None)
    if name == "choice":
        return "[" + "|".join(map(str, ptype.choices)) + "]"
    if name is None and hasattr(param, "bare_type"):  # typer >= 0.26 vendors click and has no .type
        name = param.bare_type()
        if name.startswith("list[") and name.endswith("]"):
            name = name[5:-1]
    return _METAVARS.get(name, str(name).upper())


def _is_flag(param) -> bool:
    return bool(getattr(param, "is_flag", False) or getattr(param, "count", False))


def _option_names(param) -> str:
    names = ", ".join(sorted(param.opts, key=len))
    if not _is_flag(param):
        names += f" {metavar(param)}"
    if param.secondary_opts:  # the negative form on a line of its own: names never wrap
        names += " /\n" + ", ".join(sorted(param.secondary_opts, key=len))
    return names


def _option_help(param, ctx) -> str:
    """The help text with click's ``[default: ..; x>=1]`` suffix (click builds it; the option
    names it returns are not used)."""
    record = param.get_help_record(ctx)
    return record[1] if record else ""


def _paragraphs(doc: str) -> list[str]:
    """Docstring paragraphs, single newlines joined (``\\b`` keeps a paragraph's lines)."""
    out = []
    for p in inspect.cleandoc(doc).split("\f")[0].split("\n\n"):
        if p.startswith("\b"):
            out.append(p[1:].lstrip("\n"))
        else:
            out.append(" ".join(line.strip() for line in p.splitlines()))
    return [p for p in out if p.strip()]


def _usage(cmd, ctx) -> str:
    pieces = ["[OPTIONS]"]
    for param in cmd.get_params(ctx):
        if param.param_type_name == "argument":
            name = (param.metavar or param.name.upper()) + ("..." if param.nargs != 1 else "")
            pieces.append(name if param.required else f"[{name}]")
    if isinstance(cmd, TyperGroup):
        pieces.append("COMMAND [ARGS]...")
    return f"Usage: {ctx.command_path} {' '.join(pieces)}"


def render_help(cmd, ctx) -> RenderableType:
    parts: list[RenderableType] = [Text(_usage(cmd, ctx), style="bold"), Text("")]
    for p in _paragraphs(cmd.help or ""):
        parts += [Padding(Text.from_markup(p), (0, 0, 0, 2)), Text("")]
    args, opts = FitTable(show_header=False, compact=True), FitTable(show_header=False, compact=True)
    for t in (args, opts):
        t.add_column(style="bold", wrap=False)
        t.add_column()
    for param in cmd.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            name = param.metavar or param.name.upper()
            helptext = getattr(param, "help", None) or ""
            if param.required:
                helptext += "  [required]"
            args.add_row(Text(name), Text(helptext.strip()))
        else:
            opts.add_row(Text(_option_names(param)), Text(_option_help(param, ctx)))
    for title, table in (("Arguments", args), ("Options", opts)):
        if table.rows:
            parts += [Text(title, style="bold"), Padding(table, (0, 0, 0, 2)), Text("")]
    if isinstance(cmd, TyperGroup):
        verbs = FitTable(show_header=False, compact=True)
        verbs.add_column(style="bold", wrap=False)
        verbs.add_column()
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            first = _paragraphs(sub.help or "")
            verbs.add_row(Text(name), Text.from_markup(first[0]) if first else Text(""))
        if verbs.rows:
            parts += [Text("Commands", style="bold"), Padding(verbs, (0, 0, 0, 2)), Text("")]
    return Group(*parts)


def _write(cmd, ctx, formatter) -> None:
    from dayzero.cli.common import console

    with console.capture() as cap:
        console.print(render_help(cmd, ctx), highlight=False)
    formatter.write("\n".join(line.rstrip() for line in cap.get().splitlines()) + "\n")


class HelpCommand(TyperCommand):
    def format_help(self, ctx, formatter) -> None:
        _write(self, ctx, formatter)


class HelpGroup(TyperGroup):
    def format_help(self, ctx, formatter) -> None:
        _write(self, ctx, formatter)
