"""Where the test tree lives."""

from pathlib import Path

from dayzero.specs.presets import reference_data

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
DATA = TESTS / "data"
HELPERS = TESTS / "helpers"


def data_file(name: str) -> Path:
    """A shipped reference file (``src/dayzero/specs/presets/data``): the tests read nothing outside the
    repository."""
    return reference_data(name)


def published_rows_file(directory: Path, ids: tuple[str, ...]) -> Path:
    """A CSV of the dev file's rows ``ids`` (its own header), written under ``directory``."""
    import csv

    rows = list(csv.DictReader(data_file("published_runs_dev.csv").open()))
    f = directory / "runs.csv"
    with f.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([r for r in rows if r["id"] in ids])
    return f
