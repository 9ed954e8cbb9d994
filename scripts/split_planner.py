"""Split the flat ``src/dayzero/planner/`` into its four rooms (issue 41, item 1), replayably.

Run from the repository root on a clean work tree: ``python scripts/split_planner.py``. It

1. ``git mv``s each planner module into its subpackage (``memory/``, ``perf/``, ``search/``,
   ``backtest/``; the modules every room uses stay at the top of ``planner/``), and the tests of
   ``tests/planner/`` into the mirrored folders;
2. rewrites every reference to a moved module across ``src/``, ``tests/``, ``benchmarks/``,
   ``scripts/``, ``docs/`` and the top-level Markdown files: ``from dayzero.planner.X import``,
   ``import dayzero.planner.X``, ``from dayzero.planner import X``, strings such as monkeypatch
   targets ``"dayzero.planner.X.f"``, prose such as ``planner.X`` and paths ``planner/X.py`` and
   ``tests/planner/test_X.py``.

The rewritten files' import blocks are sorted again with ``ruff check --select I --fix``; lines
the longer paths push past the length limit are left to a hand commit. It runs once, on a tree
not yet split (it refuses a tree that has ``planner/memory/``: after the split
``dayzero.planner.memory`` names the room, no longer the module, so a second pass could not tell
them apart). It only moves and renames; the subpackages' ``__init__`` exports and the
functions moved between modules are separate, hand-made commits.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOMS = {
    "memory": ["memory", "memory_terms", "memory_options", "activations", "activation_offload", "allocator",
               "replay", "offload", "memory_breakdown", "params", "balance"],
    "perf": ["perf", "comm", "compute", "collectives", "topology", "moe_dispatch", "moe_imbalance", "eplb",
             "scale_effects", "calibration", "fp8_scaling", "minimize"],
    "search": ["search", "search_space", "search_fit", "switches", "remedies", "explain", "sensitivity",
               "error_band", "cp_choice"],
    "backtest": ["backtest", "published", "row_arch", "row_memory", "interconnect_text", "model_names",
                 "csv_values", "run_features"],
}
TOP = ["engines", "targets", "schedule", "predict", "training_cost"]  # used by every room: stay in planner/
DATA = {"data": "backtest"}  # planner/data/ (published_models.json) goes with the published-run reader

TEST_ROOMS = {
    "memory": ["activation_offload", "fp8_params", "gradient_windows", "memory", "memory_activations",
               "memory_allocator", "memory_breakdown", "memory_properties", "optimizer_offload",
               "recompute_modules"],
    "perf": ["collectives", "cp_comm", "eplb", "fp8_scaling", "missing_collectives", "moe_backtest_effects",
             "moe_dispatch", "perf", "scale_effects", "topology"],
    "search": ["offload_search", "plan_explain", "search", "search_gates", "search_published", "switch_search",
               "uncertainty"],
    "backtest": ["backtest", "backtest_holdout", "backtest_memory", "hybrid_rows", "published_rows"],
}
TEXT_DIRS = ["src", "tests", "benchmarks", "scripts", "docs"]
TEXT_FILES = ["README.md"]
SUFFIXES = {".py", ".md", ".toml", ".txt", ".yaml", ".yml", ".cfg", ".ini"}

ROOM_OF = {m: room for room, mods in ROOMS.items() for m in mods}
TEST_ROOM_OF = {t: room for room, tests in TEST_ROOMS.items() for t in tests}


def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True)


def move_files(root: Path) -> None:
    planner = root / "src/dayzero/planner"
    for room, mods in ROOMS.items():
        (planner / room).mkdir(exist_ok=True)
        init = planner / room / "__init__.py"
        if not init.exists():
            init.write_text(f'"""The planner\'s {room} room."""\n')
            git("add", str(init))
        for m in mods:
            src = planner / f"{m}.py"
            if src.exists():
                git("mv", str(src), str(planner / room / f"{m}.py"))
    for name, room in DATA.items():
        if (planner / name).is_dir():
            git("mv", str(planner / name), str(planner / room / name))
    tests = root / "tests/planner"
    for t, room in TEST_ROOM_OF.items():
        src = tests / f"test_{t}.py"
        if src.exists():
            (tests / room).mkdir(exist_ok=True)
            git("mv", str(src), str(tests / room / f"test_{t}.py"))


def _room_mods(room: str) -> str:
    return "|".join(ROOMS[room])


# dayzero.planner.X / planner.X / planner/X.py, X a moved module, not already under its room: the
# lookbehind keeps ``planner.perf.comm`` from matching ``comm`` again; for a module named like its
# room (memory, perf, search, backtest) the lookahead keeps ``planner.memory.memory_terms``
# (already moved) from being read as the old ``planner.memory`` module.
MODS = "|".join(sorted(ROOM_OF, key=len, reverse=True))
DOTTED = re.compile(rf"(?<![\w.])((?:dayzero\.)?planner)\.({MODS})\b(?!\.(?:{'|'.join(ROOM_OF)})\b)")
SLASHED = re.compile(rf"(?<!\w)(planner)/({MODS})(\.py)\b")
FROM_PLANNER = re.compile(r"^(\s*)from dayzero\.planner import ([\w ,]+?)\s*$", re.M)
TEST_PATH = re.compile(r"(?<![\w/])tests/planner/test_(\w+)\.py")


def _dotted(m: re.Match) -> str:
    return f"{m.group(1)}.{ROOM_OF[m.group(2)]}.{m.group(2)}"


def _slashed(m: re.Match) -> str:
    return f"{m.group(1)}/{ROOM_OF[m.group(2)]}/{m.group(2)}{m.group(3)}"


def _from_planner(m: re.Match) -> str:
    """``from dayzero.planner import a, b as c``: one ``from dayzero.planner.<room> import`` per room."""
    indent, names = m.group(1), [n.strip() for n in m.group(2).split(",") if n.strip()]
    by_room: dict[str, list[str]] = {}
    for n in names:
        base = n.split(" as ")[0].strip()
        by_room.setdefault(ROOM_OF.get(base, ""), []).append(n)
    lines = []
    for room, ns in by_room.items():
        where = f"dayzero.planner.{room}" if room else "dayzero.planner"
        lines.append(f"{indent}from {where} import {', '.join(ns)}")
    return "\n".join(lines)


def _test_path(m: re.Match) -> str:
    room = TEST_ROOM_OF.get(m.group(1))
    return f"tests/planner/{room}/test_{m.group(1)}.py" if room else m.group(0)


def rewrite(text: str) -> str:
    text = DOTTED.sub(_dotted, text)  # before FROM_PLANNER: its output names rooms, not modules
    text = FROM_PLANNER.sub(_from_planner, text)
    text = SLASHED.sub(_slashed, text)
    text = TEST_PATH.sub(_test_path, text)
    # the data folder moved with the published-run reader
    text = text.replace("planner/data/published_models", "planner/backtest/data/published_models")
    return text.replace('resources.files("dayzero.planner") / "data"',
                        'resources.files("dayzero.planner.backtest") / "data"')


def rewrite_tree(root: Path) -> list[Path]:
    files = [root / f for f in TEXT_FILES if (root / f).exists()]
    for d in TEXT_DIRS:
        files += [p for p in sorted((root / d).rglob("*")) if p.is_file() and p.suffix in SUFFIXES]
    changed = []
    for p in files:
        if p.resolve() == Path(__file__).resolve():
            continue
        old = p.read_text()
        new = rewrite(old)
        if new != old:
            p.write_text(new)
            changed.append(p)
    return changed


def main() -> int:
    root = Path.cwd()
    if not (root / "src/dayzero/planner").is_dir():
        print("run from the repository root (src/dayzero/planner not found)", file=sys.stderr)
        return 2
    if (root / "src/dayzero/planner/memory").is_dir():
        print("the planner is already split (src/dayzero/planner/memory/ exists): nothing to do", file=sys.stderr)
        return 1
    move_files(root)
    planner, tests = root / "src/dayzero/planner", root / "tests/planner"
    unplaced = sorted(p.stem for p in planner.glob("*.py") if p.stem not in TOP and p.stem != "__init__")
    if unplaced:  # a module added since this list was written stays at the top: say so
        print(f"left at the top of planner/ (not in ROOMS or TOP): {', '.join(unplaced)}", file=sys.stderr)
    left = sorted(p.name for p in tests.glob("test_*.py"))
    print(f"tests left in tests/planner/ (shared modules, or crossing rooms): {', '.join(left)}")
    changed = rewrite_tree(root)
    print(f"rewrote references in {len(changed)} files")
    # the rewritten import blocks sorted again (isort order depends on the module paths)
    py = [str(p) for p in changed if p.suffix == ".py"]
    subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", "--select", "I", "--fix", *py], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
