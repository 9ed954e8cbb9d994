"""Reading user files: one place that turns every way a file can be wrong into one line.

Every file a user hands dayzero (model configs, cluster and calibration files, published-runs
CSVs, nccl-tests output, checkpoint side files) is read through :func:`read_text` and parsed with
:func:`parse_json` / :func:`parse_yaml`, so a missing file, a directory, an unreadable or
non-UTF-8 file, malformed or absurdly nested JSON/YAML and integers too long to be a size are a
:class:`~dayzero.errors.ConfigError` naming the file, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dayzero.errors import ConfigError

MAX_FILE_BYTES = 64 * 2**20  # a config, cluster file or CSV is kilobytes; refuse before reading gigabytes
MAX_DEPTH = 64  # nesting of a JSON/YAML document (real configs nest 3-4 levels)


def read_text(path: str | Path, hint: str = "") -> str:
    """The UTF-8 text of ``path``; ``hint`` says what to pass instead when it is missing."""
    p = Path(path)
    try:
        if p.is_dir():
            raise ConfigError(str(p), None, "is a directory; expected a file" + (f" ({hint})" if hint else ""))
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(str(p), None, f"is {size / 2**20:,.0f} MiB; a file of this kind is at most "
                              f"{MAX_FILE_BYTES // 2**20} MiB")
        return p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(str(p), None, "file not found" + (f"; {hint}" if hint else "")) from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), None, f"is not UTF-8 text (invalid byte at offset {e.start}); "
                          "save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(str(p), None, f"cannot read: {e.strerror or e}") from None


def _depth(obj: Any, limit: int) -> int:
    """Nesting depth of plain data, without recursion (so a hostile document cannot overflow)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return d
        deepest = max(deepest, d)
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return deepest


def _checked(obj: Any, source: str) -> Any:
    if _depth(obj, MAX_DEPTH) > MAX_DEPTH:
        raise ConfigError(source, None, f"is nested more than {MAX_DEPTH} levels deep; not a dayzero input")
    return obj


def parse_json(text: str, source: str) -> Any:
    """JSON text -> data, with one-line errors (syntax, depth, integers beyond 4300 digits)."""
    try:
        return _checked(json.loads(text), source)
    except json.JSONDecodeError as e:
        raise ConfigError(source, None, f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ConfigError(source, None, "is nested too deeply to be a dayzero input") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise ConfigError(source, None, _value_error(e)) from None


def _value_error(e: ValueError) -> str:
    text = str(e).splitlines()[0]
    if "digits" in text and "integer" in text:
        return "holds an integer thousands of digits long; no dayzero field is that large"
    return f"cannot parse: {text}"


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data (safe loader: no tags run), with one-line errors."""
    import yaml

    try:
        return _checked(yaml.safe_load(text), source)
    except yaml.YAMLError as e:
        raise ConfigError(source, None, f"malformed YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(source, None, "is nested too deeply to be a dayzero input") from None
    except ValueError as e:
        raise ConfigError(source, None, _value_error(e)) from None


def load_json(path: str | Path, hint: str = "") -> Any:
    return parse_json(read_text(path, hint), str(path))


def load_yaml(path: str | Path, hint: str = "") -> Any:
    return parse_yaml(read_text(path, hint), str(path))
