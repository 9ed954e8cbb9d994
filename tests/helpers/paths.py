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
