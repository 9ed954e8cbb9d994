"""Every value an export writes into a generated file, quoted for that file: one function per target.

A generated file is run or parsed by someone else's program (``bash``, ``sbatch``, a YAML loader,
an argument-file reader), so a value that carries its own syntax could run as code when the job
starts. The rules, one place for every export:

* a value with a control character (a newline, a carriage return, an escape, NUL, ...) or a Unicode
  line or paragraph separator is refused with one line naming the option it came from: no quoting
  keeps a newline from ending an ``#SBATCH`` line or a comment;
* a shell word is single-quoted (``shlex.quote``), so ``$(...)``, backquotes, ``;`` and globs are
  text; only the variables the script itself sets (:func:`shell_word`'s ``expand``) are expanded,
  each as a double-quoted ``"$NAME"`` spliced between single-quoted literal text;
* an ``#SBATCH`` value is a shell-free token that sbatch reads up to the next space: it must hold no
  space, quote, backslash or ``#`` (sbatch's own parser, ``src/sbatch/opt.c`` ``_get_argument``,
  takes an option's value up to white space);
* YAML is written by ``yaml.safe_dump`` (it quotes every scalar that needs it), after the same
  control-character refusal over every string in the document.
"""

from __future__ import annotations

import re
import shlex
import unicodedata

import yaml

from dayzero.errors import ConfigError

_SEPARATORS = {"Zl", "Zp"}  # U+2028 line and U+2029 paragraph separators end a line for some readers


def refuse_control(where: str, value: str) -> str:
    """``value`` unchanged, or one ConfigError naming ``where`` if it holds a control character."""
    for ch in value:
        if unicodedata.category(ch) == "Cc" or unicodedata.category(ch) in _SEPARATORS:
            raise ConfigError(where, None, f"holds the control character U+{ord(ch):04X} (a newline or escape "
                              "would let the text run as a command in the generated file); remove it")
    return value


_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


class Ref(str):
    """A word the exporter itself built that refers to variables of the generated file
    (``$CKPT_DIR``, ``$MASTER_ADDR:$MASTER_PORT``): only such a word has its references expanded;
    a user's text is always literal, whatever it holds."""


def shell_word(value: str, where: str = "a value", expand: frozenset[str] = frozenset()) -> str:
    """``value`` as one shell word: literal text single-quoted; in a :class:`Ref` only the ``$NAME``
    references whose name is in ``expand`` (variables the generated script sets) are left for the
    shell to expand, each double-quoted."""
    refuse_control(where, value)
    if not expand or not isinstance(value, Ref):
        return shlex.quote(value)
    out, at = [], 0
    for m in _VARIABLE.finditer(value):
        if m.group(1) not in expand:
            continue
        if m.start() > at:
            out.append(shlex.quote(value[at:m.start()]))
        out.append(f'"${{{m.group(1)}}}"')
        at = m.end()
    if at < len(value) or not out:
        out.append(shlex.quote(value[at:]))
    return "".join(out)


def shell_line(words: list[str], where: str = "a value", expand: frozenset[str] = frozenset()) -> str:
    """Words joined into one shell command line, each through :func:`shell_word`."""
    return " ".join(shell_word(w, where, expand) for w in words)


_K8S_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_arg(value: str, where: str = "a value", expand: frozenset[str] = frozenset()) -> str:
    """A container's command word: Kubernetes expands ``$(NAME)`` from the container's environment
    and reads ``$$`` as a literal ``$`` (https://kubernetes.io/docs/tasks/inject-data-application/
    define-interdependent-environment-variables/), so every ``$`` of literal text is doubled and only a
    :class:`Ref`'s ``$(NAME)`` with NAME in ``expand`` stays a reference."""
    refuse_control(where, value)
    if not isinstance(value, Ref):
        return value.replace("$", "$$")
    out, at = [], 0
    for m in _K8S_VARIABLE.finditer(value):
        if m.group(1) in expand:
            out += [value[at:m.start()].replace("$", "$$"), m.group(0)]
            at = m.end()
    return "".join(out) + value[at:].replace("$", "$$")


def comment(text: str, where: str = "a comment") -> str:
    """A ``#`` comment line of ``text`` (a control character would end the comment)."""
    return "# " + refuse_control(where, text)


_SBATCH_UNSAFE = re.compile(r"[\s\"'\\#]")


def sbatch_value(where: str, value: str) -> str:
    """A value of an ``#SBATCH`` line: no control character, no space, quote, backslash or ``#``."""
    refuse_control(where, value)
    bad = _SBATCH_UNSAFE.search(value)
    if bad:
        raise ConfigError(where, None, f"{value!r}: an #SBATCH line takes its value up to the first space and "
                          f"cannot quote {bad.group(0)!r}; use a value without spaces, quotes, backslashes or '#'")
    return value


def yaml_documents(docs: list, where: str = "a manifest value", files: tuple[dict, ...] = ()) -> str:
    """YAML of ``docs`` (``yaml.safe_dump_all``), after refusing a control character in any string;
    the values of the mappings in ``files`` (a ConfigMap's file texts, which YAML writes as quoted
    or block scalars) may hold line breaks and nothing else."""
    def walk(x, lines=False):
        if isinstance(x, str):
            refuse_control(where, x.replace("\n", "") if lines else x)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v, any(x is f for f in files))
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(docs)
    return yaml.safe_dump_all(docs, sort_keys=False)


def argument_lines(args: list[str], where: str = "an argument") -> str:
    """An argument file: one flag and its values per line, each word shell-quoted (the reader
    splits it with ``shlex``)."""
    lines: list[list[str]] = []
    for w in args:
        if w.startswith("--") or not lines:
            lines.append([w])
        else:
            lines[-1].append(w)
    return "".join(shell_line(line, where) + "\n" for line in lines)
