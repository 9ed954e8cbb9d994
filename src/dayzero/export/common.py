"""What every engine writer returns, and the check that the engine can run the plan at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dayzero.errors import LayoutError
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


def require_engine(engine: str, parallel: ParallelConfig) -> None:
    """One LayoutError saying why ``engine`` cannot run ``parallel`` as laid out."""
    problems = engine_problems(engine, parallel)
    if problems:
        raise LayoutError(f"{get_engine(engine).title} cannot run {parallel.describe()}: {'; '.join(problems)}; "
                          f"search for a layout it runs with `dayzero plan --engine {get_engine(engine).name}`")
