"""Reading user files: one place that turns every way a file can be wrong into one line.

Every file a user hands dayzero (model configs, cluster and calibration files, published-runs
CSVs, metrics streams, plan files, engine launch files, checkpoint side files) is opened through
:func:`read_bytes` / :func:`read_text` and parsed with :func:`parse_json` / :func:`parse_yaml`, so a
missing file, a directory, a named pipe, a device (``/dev/zero``), a socket, an unreadable or
non-UTF-8 file, a file too large for its kind, malformed or absurdly nested JSON/YAML, a YAML alias
bomb, a duplicate key and integers too long to be a size are a :class:`~dayzero.errors.ConfigError`
naming the file, never a hang or a traceback.

Opening: the path is ``stat``-ed before it is opened (only a regular file is opened at all), opened
with ``O_NONBLOCK`` (so a FIFO swapped in between the two calls cannot block the open) and
``fstat``-ed again (the file actually opened is the one checked); at most ``limit + 1`` bytes are
read, so the size is bounded even when the file grows while it is read. A regular file's read
never waits on a writer, so no timeout is needed once special files are refused.

YAML: read with the YAML 1.2 core schema's plain scalars (``yes``, ``on`` and ``1:30`` stay
strings instead of YAML 1.1's ``True`` and sexagesimal 90; ``010`` is ten), duplicate keys refused,
and aliases bounded: a document whose aliases expand to more than :data:`MAX_YAML_NODES` nodes (a
"billion laughs") or refer to themselves is refused before it is built.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from dayzero.errors import ConfigError

MAX_FILE_BYTES = 64 * 2**20  # a config, cluster file or CSV is kilobytes; refuse before reading gigabytes
STREAM_BYTES = 512 * 2**20  # a metrics stream: ~300 bytes a step, so over a million steps
MAX_DEPTH = 64  # nesting of a JSON/YAML document (real configs nest 3-4 levels)
MAX_YAML_NODES = 100_000  # a cluster or calibration file holds a few hundred values; expanded aliases included
_CHUNK = 1 << 20


def file_type(mode: int) -> str:
    """What a ``st_mode`` names, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(p: Path, mode: int, hint: str) -> ConfigError:
    kind = file_type(mode)
    what = "expected a regular file"
    return ConfigError(str(p), None, f"is {kind}; {what}" + (f" ({hint})" if hint else ""))


def _stat(p: Path, kind: str, hint: str) -> os.stat_result:
    """``os.stat`` of ``p`` (symlinks followed), or a one-line ConfigError: ``kind`` not found, or unreadable."""
    try:
        return os.stat(p)
    except FileNotFoundError:
        raise ConfigError(str(p), None, f"{kind} not found" + (f"; {hint}" if hint else "")) from None
    except OSError as e:
        raise ConfigError(str(p), None, f"cannot read: {e.strerror or e}") from None


def check_regular(path: str | Path, hint: str = "") -> os.stat_result:
    """``os.stat`` of ``path`` when it is a regular file (symlinks followed); a one-line
    ConfigError naming the path and its type otherwise. Nothing is opened."""
    p = Path(path)
    st = _stat(p, "file", hint)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(p, st.st_mode, hint)
    return st


def check_directory(path: str | Path, hint: str = "") -> None:
    """A one-line ConfigError unless ``path`` is a directory (symlinks followed)."""
    p = Path(path)
    st = _stat(p, "directory", hint)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(str(p), None, f"is {file_type(st.st_mode)}; expected a directory"
                          + (f" ({hint})" if hint else ""))


def _too_big(p: Path, size: int, limit: int) -> ConfigError:
    return ConfigError(str(p), None, f"is {_size(size)}; a file of this kind is at most {_size(limit)}")


def _size(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


def read_bytes(path: str | Path, hint: str = "", limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (see the module's note)."""
    p = Path(path)
    st = check_regular(p, hint)
    if st.st_size > limit:
        raise _too_big(p, st.st_size, limit)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ConfigError(str(p), None, "file not found" + (f"; {hint}" if hint else "")) from None
    except OSError as e:
        raise ConfigError(str(p), None, f"cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for a FIFO or device between stat and open
            raise _refuse(p, st.st_mode, hint)
        if st.st_size > limit:
            raise _too_big(p, st.st_size, limit)
        parts, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - got))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        if got > limit:
            raise _too_big(p, got, limit)
        return b"".join(parts)
    except OSError as e:
        raise ConfigError(str(p), None, f"cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_text(path: str | Path, hint: str = "", limit: int = MAX_FILE_BYTES, errors: str = "strict") -> str:
    """The UTF-8 text of ``path``; ``hint`` says what to pass instead when it is missing.
    ``errors="replace"``: for logs and streams a torn write may leave half a character in."""
    raw = read_bytes(path, hint, limit)
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), None, f"is not UTF-8 text (invalid byte at offset {e.start}); "
                          "save it as UTF-8") from None


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


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    """``Infinity`` is read as the float Python's json writes it as: Hugging Face configs carry it
    (transformers' FalconH1Config.time_step_limit defaults to (0.0, inf), saved as ``Infinity``), and
    every field dayzero reads checks its own range; ``NaN`` never means anything."""
    if name in ("Infinity", "-Infinity"):
        return float(name.replace("Infinity", "inf"))
    raise ValueError(f"holds {name}, which is not a JSON number; write a finite number")


def parse_json(text: str, source: str) -> Any:
    """JSON text -> data, with one-line errors (syntax, depth, duplicate keys, NaN, integers beyond
    4300 digits); ``Infinity`` stays a float (:func:`_no_constant`)."""
    try:
        return _checked(json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant), source)
    except json.JSONDecodeError as e:
        raise ConfigError(source, None, f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except _Duplicate as e:
        raise ConfigError(source, str(e), "appears twice in one object; keep one (JSON readers disagree on "
                          "which wins)") from None
    except RecursionError:
        raise ConfigError(source, None, "is nested too deeply to be a dayzero input") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise ConfigError(source, None, _value_error(e)) from None


def _value_error(e: ValueError) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "digits" in text and "integer" in text:
        return "holds an integer thousands of digits long; no dayzero field is that large"
    if text.startswith("holds "):
        return text
    return f"cannot parse: {text}"


# -- YAML ---------------------------------------------------------------------------------------

MAX_YAML_BYTES = 4 * 2**20  # the pure-Python reader (needed for the alias bound) takes seconds per MiB

# YAML 1.2 core schema plain scalars (https://yaml.org/spec/1.2.2/#1032-tag-resolution): no
# yes/no/on/off booleans, no sexagesimal 1:30, no timestamps; every pattern is linear.
_YAML12 = (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    ("tag:yaml.org,2002:float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+0123456789.")),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:merge", r"^(?:<<)$", ["<"]),
)


def _yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with YAML 1.2 core scalars, duplicate keys refused, decimal ints."""

        yaml_implicit_resolvers: dict = {}

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        if key in seen:
                            raise _Duplicate(key)
                        seen.add(key)
                    except TypeError:
                        continue
            return super().construct_mapping(node, deep)

    def _int(loader, node):
        v = loader.construct_scalar(node)
        sign, s = (-1, v[1:]) if v[:1] == "-" else (1, v.lstrip("+"))
        if s.startswith("0o"):
            return sign * int(s[2:], 8)
        if s.startswith("0x"):
            return sign * int(s[2:], 16)
        return sign * int(s, 10)

    Loader.add_constructor("tag:yaml.org,2002:int", _int)
    for tag, pattern, first in _YAML12:
        Loader.add_implicit_resolver(tag, re.compile(pattern), first)
    return Loader


def _expanded_nodes(root: Any, limit: int) -> int:
    """How many nodes the YAML graph under ``root`` holds once every alias is expanded (memoised
    per node, so linear in the document); ``-1`` when an alias refers to a node containing it."""
    import yaml

    size: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                else node.value if isinstance(node, yaml.SequenceNode) else [])
        if done:
            active.discard(key)
            size[key] = min(limit + 1, 1 + sum(size[id(k)] for k in kids))
            continue
        if key in size:
            continue
        if key in active:
            return -1
        active.add(key)
        stack.append((node, True))
        for k in kids:
            if id(k) in active:
                return -1
            if id(k) not in size:
                stack.append((k, False))
    return size[id(root)]


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data (safe loader: no tags run; see the module's note), with one-line errors."""
    import yaml

    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(source, None, f"is {_size(len(text))} of YAML; a file of this kind is at most "
                          f"{_size(MAX_YAML_BYTES)}")
    loader = _yaml_loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = _expanded_nodes(node, MAX_YAML_NODES)
        if n < 0:
            raise ConfigError(source, None, "holds an alias that refers to itself (a recursive YAML document); "
                              "write the values out")
        if n > MAX_YAML_NODES:
            raise ConfigError(source, None, f"expands to more than {MAX_YAML_NODES:,} values through its "
                              "aliases (*name); write the values out or use fewer aliases")
        return _checked(loader.construct_document(node), source)
    except ConfigError:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source, None, f"malformed YAML{where}: {problem}") from None
    except _Duplicate as e:
        raise ConfigError(source, str(e.args[0]), "appears twice in one mapping; keep one (YAML readers "
                          "disagree on which wins)") from None
    except RecursionError:
        raise ConfigError(source, None, "is nested too deeply to be a dayzero input") from None
    except ValueError as e:
        raise ConfigError(source, None, _value_error(e)) from None
    finally:
        loader.dispose()


def load_json(path: str | Path, hint: str = "", limit: int = MAX_FILE_BYTES) -> Any:
    return parse_json(read_text(path, hint, limit), str(path))


def load_yaml(path: str | Path, hint: str = "") -> Any:
    return parse_yaml(read_text(path, hint, MAX_YAML_BYTES), str(path))


def read_lines(path: str | Path, hint: str = "", max_line: int = 1 << 20, limit: int = MAX_FILE_BYTES) -> list[str]:
    """The lines of a text file (argument lists, JSONL), refusing any line longer than ``max_line``
    characters (no flag, value or record of a dayzero input is that long)."""
    text = read_text(path, hint, limit)
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if end - start > max_line:
            line = text.count("\n", 0, start) + 1
            raise ConfigError(str(path), None, f"line {line} is {end - start:,} characters long; a line of this "
                              f"kind is at most {max_line:,}")
        start = end + 1
    return text.splitlines()


def jsonl_objects(path: str | Path, hint: str = "", limit: int = STREAM_BYTES):
    """The JSON objects of a JSONL file (a ``dayzero train --metrics`` stream), in order; a line that
    is not a JSON object (a record cut by a crash mid-write) is skipped. A missing or unreadable file
    is :func:`read_text`'s one-line error with ``hint``."""
    import json

    for line in read_text(path, hint, limit, errors="replace").splitlines():
        if line.strip():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj
