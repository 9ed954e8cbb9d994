"""What every engine writer returns, and the check that the engine can run the plan at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dayzero.errors import ConfigError, LayoutError
from dayzero.planner.engines import engine_problems, get_engine
from dayzero.specs.parallel import ParallelConfig


@dataclass(frozen=True)
class Export:
    """An engine's launch of one plan: ``files`` (name -> text), the command that runs it, and the
    settings the engine has no way to express (so a reader knows what the launch leaves out)."""

    engine: str
    files: dict[str, str]
    command: list[str]
    unexpressed: list[str] = field(default_factory=list)

    def write(self, out: str | Path) -> list[Path]:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in self.files.items():
            p = folder / name
            p.write_text(text)
            paths.append(p)
        return paths

    def to_dict(self) -> dict:
        return {"engine": self.engine, "files": self.files, "command": self.command, "unexpressed": self.unexpressed}


def require_engine(engine: str, parallel: ParallelConfig, switches: dict | None = None) -> None:
    """One LayoutError saying why ``engine`` cannot run ``parallel`` as laid out (with the run's
    ``switches``, planner.engines.RUN_SWITCHES)."""
    problems = engine_problems(engine, parallel, switches)
    if problems:
        raise LayoutError(f"{get_engine(engine).title} cannot run {parallel.describe()}: {'; '.join(problems)}; "
                          f"search for a layout it runs with `dayzero plan --engine {get_engine(engine).name}`")


MAX_SETTING = 2**31  # an imported degree, batch or length at or above this is not a launch setting


def integer_setting(source: str, where: str, value: object, *, minimum: int = 1,
                    unset: int | None = None) -> int:
    """An integer an engine file states (a JSON number or the text of a flag): whole, in
    [``minimum``, 2^31), or the engine's own ``unset`` marker; anything else is one ConfigError
    naming ``source`` and ``where``. The one rule every importer reads its numbers with."""
    n = None
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            n = int(value)
        except ValueError:
            n = None
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    if n is None:
        raise ConfigError(source, where, f"expected an integer, got {value!r}")
    if n != unset and not minimum <= n < MAX_SETTING:
        raise ConfigError(source, where, f"expected an integer in [{minimum}, 2^31), got {n}")
    return n
