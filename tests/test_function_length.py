"""No function in ``src/dayzero`` is over 80 lines (from its ``def`` line to its last line, signature,
docstring and nested functions included): a verb parses, calls one library function and renders;
longer logic is split into named helpers by concept."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_LINES = 80
SRC = Path(__file__).resolve().parents[1] / "src" / "dayzero"

# (path under src/dayzero, function name) of generated tables allowed to be longer, each with a comment
# saying what generates it. None today: keep it that way unless a table is generated.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function (methods, nested and async ones included) of
    ``source`` longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append((node.name, node.lineno, lines))
    return sorted(out, key=lambda f: f[1])


def test_no_function_is_over_80_lines():
    over = [f"{path.relative_to(SRC)}:{line} {name} ({lines} lines)"
            for path in sorted(SRC.rglob("*.py"))
            for name, line, lines in long_functions(path.read_text())
            if (path.relative_to(SRC).as_posix(), name) not in ALLOWED]
    assert not over, (f"functions over {MAX_LINES} lines (split them into named helpers by concept, a verb's "
                      "logic into the library):\n" + "\n".join(over))


def test_the_allow_list_names_functions_that_exist():
    for path, name in ALLOWED:
        source = (SRC / path).read_text()
        assert any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                   for n in ast.walk(ast.parse(source))), f"{path}: no function {name}"


def _function(name: str, body_lines: int, indent: str = "") -> str:
    return f"{indent}def {name}():\n" + f"{indent}    x = 1\n" * body_lines


def test_a_function_of_81_lines_is_caught_and_one_of_80_is_not():
    assert long_functions(_function("ok", MAX_LINES - 1)) == []
    assert long_functions(_function("too_long", MAX_LINES)) == [("too_long", 1, MAX_LINES + 1)]


def test_methods_nested_and_async_functions_are_measured():
    method = "class C:\n" + _function("method", MAX_LINES, indent="    ")
    nested = "def outer():\n" + _function("inner", MAX_LINES, indent="    ")
    is_async = _function("run", MAX_LINES).replace("def run", "async def run")
    assert [f[0] for f in long_functions(method)] == ["method"]
    assert [f[0] for f in long_functions(nested)] == ["outer", "inner"]
    assert [f[0] for f in long_functions(is_async)] == ["run"]


def test_a_long_signature_and_docstring_count():
    signature = "def verb(\n" + "".join(f"    a{i}: int = {i},\n" for i in range(60)) + "):\n"
    docstring = '    """' + "\n".join(["text"] * 20) + '"""\n'
    assert [f[0] for f in long_functions(signature + docstring + "    return None\n")] == ["verb"]
