"""Human output a user can live in: every table fits 80 columns (a pipe, a CI log) without cutting
a value, help without type noise, --version, bare `dayzero`, the hardware sheet, the next command
each verb ends with, and the file modes of exported weights."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from dayzero.cli import common
from dayzero.cli.app import main, package_version
from dayzero.cli.render import MISSING, FitTable, value_text
from dayzero.specs.cluster import cluster_presets
from dayzero.specs.hardware import catalog
from helpers.paths import published_rows_file

WIDTHS = (80, 100, 132)
_NUMBER = re.compile(r"[+-]?\d[\d,]*(\.\d+)?(e[+-]\d+)?(%|x)?")
_EDGES = "()[]{};:,|│┃┆'\"="


@pytest.fixture
def width(monkeypatch):
    """Render at a given console width (rich fixes its width from COLUMNS when the console is
    made; this sets what COLUMNS=N would have)."""
    def set_width(w: int) -> None:
        monkeypatch.setattr(common.console, "_width", w)
    return set_width


def run(capsys, argv: list[str]) -> str:
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


_TIMING = re.compile(r"considered in [\d.]+ s")  # dayzero plan's search time differs run to run


def numbers(text: str) -> Counter:
    """Whitespace-separated tokens that are numbers (as tables print them: 1,234  5.6%  2.00x)."""
    found = Counter()
    for tok in _TIMING.sub("", text).split():
        tok = tok.strip(_EDGES)
        if _NUMBER.fullmatch(tok):
            found[tok] += 1
    return found


def assert_fits(text: str, w: int) -> None:
    assert "…" not in text, "a cell was cut with an ellipsis"
    wide = [line for line in text.splitlines() if cell_len(line) > w]
    assert not wide, f"{len(wide)} line(s) wider than {w}: {wide[0]!r}"


def assert_whole_at_every_width(capsys, width, argv: list[str]) -> str:
    """The verb's output at 80, 100 and 132 columns fits and shows every number it shows at 250."""
    width(250)
    reference = numbers(run(capsys, argv))
    out80 = ""
    for w in WIDTHS:
        width(w)
        out = run(capsys, argv)
        assert_fits(out, w)
        missing = set(reference) - set(numbers(out))
        assert not missing, f"{argv} at {w} columns lost {sorted(missing)[:8]}"
        out80 = out80 or out
    return out80


def json_of(capsys, argv: list[str]) -> dict:
    return json.loads(run(capsys, argv + ["--json"]))


def next_commands(out: str) -> list[list[str]]:
    """The commands of the trailing ``next:`` lines, continuations joined, comments dropped."""
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("next: "))
    text = "\n".join(lines[start:]).replace(" \\\n", " ")
    cmds = []
    for line in text.splitlines():
        words = shlex.split(line[len("next: "):] if line.startswith("next: ") else line, comments=True)
        if words:
            cmds.append(words)
    return cmds


# -- the table helper itself -----------------------------------------------------------------------


def render(renderable, w: int) -> str:
    c = Console(file=io.StringIO(), width=w)
    c.print(renderable)
    return c.file.getvalue()


def test_numbers_are_never_wrapped_and_text_wraps_at_spaces():
    t = FitTable(title="stages")
    t.add_column("name")
    for h in ("params", "weights GB", "% HBM"):
        t.add_column(h, num=True)
    t.add_column("description")
    t.add_row("deepseek-v3", "671,026,419,200", "1,234.56", "53.4%", "MLA + DeepSeekMoE, noaux_tc router " * 3)
    for w in (40, 80, 132):
        out = render(t, w)
        assert_fits(out, w)
        assert {"671,026,419,200", "1,234.56", "53.4%", "deepseek-v3"} <= set(numbers(out)) | set(out.split())
        assert out.count("noaux_tc") == 3  # no word broken


def test_layouts_fall_back_compact_then_vertical_and_keep_every_cell():
    t = FitTable(title="wide")
    for i in range(14):
        t.add_column(f"column {i}", num=True)
    t.add_row(*[f"{1000 + i:,}.25" for i in range(14)])
    out = render(t, 80)
    assert_fits(out, 80)
    assert all(f"{1000 + i:,}.25" in out for i in range(14))
    assert "column 13" in out and "━" not in out  # vertical: one field per line, no box

    narrow = FitTable()
    for h in ("a", "b", "c"):
        narrow.add_column(h, num=True)
    narrow.add_row("1", "2", "3")
    assert "┃" in render(narrow, 80)  # it fits boxed


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_chrome_matches_what_rich_draws(n):
    t = FitTable(compact=n % 2 == 0)
    for i in range(n):
        t.add_column(f"c{i}", num=True)
    t.add_row(*["12345"] * n)
    out = render(t, 200)
    from dayzero.cli.render import BOXED, COMPACT

    layout = COMPACT if n % 2 == 0 else BOXED
    assert max(cell_len(line) for line in out.splitlines()) == 5 * n + layout.chrome(n)


def test_value_text_shows_missing_values_as_a_dash():
    assert value_text(None) == value_text({}) == value_text([]) == MISSING
    assert value_text(1024, "GB") == "1,024 GB" and value_text(989.4) == "989.4" and value_text(True) == "yes"


# -- every verb with a table, at 80/100/132 columns ---------------------------------------------------

VERB_ARGS = [
    ["models"],
    ["hardware"],
    ["hardware", "910b"],
    ["hardware", "h100"],
    ["hardware", "gb200-nvl72-1152"],
    ["inspect", "tiny-llama"],
    ["inspect", "llama-3.1-8b"],
    ["inspect", "deepseek-v3"],
    ["memory", "llama-3.1-8b", "-a", "h100", "-n", "8", "--tp", "2", "--pp", "2", "--gbs", "16"],
    ["memory", "dense-3t", "--cluster", "ascend910b-8192", "--tp", "8", "--pp", "16", "--dp", "64", "--zero", "3",
     "--recompute", "full", "--no-simulate"],
    ["memory", "llama-3.1-70b", "-a", "h100", "-n", "64", "--tp", "8", "--gbs", "64", "--no-simulate"],
    ["predict", "llama-3.1-70b", "-a", "h100", "-n", "64", "--tp", "4", "--pp", "4", "--vpp", "5", "--gbs", "128",
     "--seq", "8192", "--sequence-parallel", "--precision", "fp8", "--tp-overlap"],
    ["predict", "tiny-moe", "-a", "h100", "-n", "8", "--ep", "4", "--dp", "8", "--gbs", "16"],
    ["plan", "llama-3.1-8b", "-a", "h100", "-n", "8", "--gbs", "64"],
    ["plan", "--top", "3"],
]


@pytest.mark.parametrize("argv", VERB_ARGS, ids=lambda a: " ".join(a[:3]))
def test_every_verb_fits_and_shows_every_number(argv, capsys, width):
    out = assert_whole_at_every_width(capsys, width, argv)
    assert next_commands(out), "ends with the next command"
    obj = json_of(capsys, argv)  # --json unchanged by the width and free of next lines
    assert "next:" not in json.dumps(obj)


def test_tables_show_the_json_numbers(capsys, width):
    """A value of the --json output, formatted as the table formats it, is in the 80-column output."""
    width(80)
    out = run(capsys, ["models"])
    toks = numbers(out)
    for m in json_of(capsys, ["models"])["models"]:
        assert str(m["layers"]) in toks and str(m["hidden"]) in toks, m["name"]

    out = run(capsys, ["hardware"])
    toks = numbers(out)
    for a in json_of(capsys, ["hardware"])["accelerators"]:
        for v in (a["peak_tflops"].get("bf16"), a["hbm_gib"], a["intra_node_p2p_gbytes_per_s"]):
            assert v is None or value_text(v) in toks, (a["id"], v)

    seed = VERB_ARGS[9]
    out, obj = run(capsys, seed), json_of(capsys, seed)
    for st in obj["stages"]:
        assert f"{st['total'] / 2**30:,.2f}" in numbers(out) and f"{st['total'] / obj['capacity_bytes']:.1%}" in out

    argv = VERB_ARGS[13]
    out, obj = run(capsys, argv), json_of(capsys, argv)
    for p in obj["plans"]:
        assert f"{p['time']['step_s']:.4g}" in numbers(out) and f"{p['throughput']['mfu']:.0%}" in numbers(out)

    out, obj = run(capsys, ["inspect", "deepseek-v3"]), json_of(capsys, ["inspect", "deepseek-v3"])
    assert f"{obj['params_total']:,}" in out and f"{obj['params_active']:,}" in out


def test_backtest_fits(tmp_path, capsys, width):
    f = published_rows_file(tmp_path, ("R0132", "R0214", "R0555", "R0671"))
    out = assert_whole_at_every_width(capsys, width, ["backtest", str(f)])
    assert next_commands(out)[0][:3] == ["dayzero", "backtest", str(f)]


def test_validate_and_calibrate_tables_fit(capsys, width):
    """Their runs take minutes (tests/validate/test_validate_run.py, test_calibrate_cli.py); the tables are
    rendered here from results of the same shape."""
    from dayzero.cli.calibrate import print_summary
    from dayzero.cli.validate import print_result

    checks = [{"metric": m, "target": t, "measured": x, "predicted": y, "rel_error": e, "unit": u, "pass": ok,
               "detail": "Mann-Kendall tau -0.91, p 1.2e-05; Theil-Sen slope -0.0213 per step"}
              for m, t, x, y, e, u, ok in (
                  ("mfu", "> 50 %", 0.0123, 0.0151, -0.185, "fraction", False),
                  ("peak_memory", "< 85 % of device memory", 0.412, 0.398, 0.035, "fraction", True),
                  ("comm_ratio", "< 15 % of step", 0.0831, None, None, "fraction", True),
                  ("step_time", "prediction within 20 %", 1.234, 1.402, -0.12, "s", True),
                  ("loss_trend", "decreasing (Mann-Kendall p < 0.05)", -0.213, None, None, "relative change", True))]
    result = {"checks": checks, "summary": {"all_pass": False}}
    summary = {"compute_dtype": "fp32", "memory_gbytes_per_s": 12.34,
               "memory_overhead": {"runtime_context_bytes": 312 * 2**20},
               "fits": {"fp32": {"peak_tflops": 0.1234, "half_dim": 312.0, "gemm_fit_mape": 0.071,
                                 "attention_tflops": 0.0456},
                        "bf16": {"peak_tflops": 0.0456, "half_dim": 1024.0, "gemm_fit_mape": 0.12,
                                 "attention_tflops": None}},
               "link_fit": {"bw_gbytes_per_s": 3.21, "alpha_us": 41.0, "p2p_gbytes_per_s": 2.9,
                            "mape": {"all_reduce": 0.08, "all_gather": 0.11}},
               "collectives": [{"collective": c, "group": g, "bytes": 16 * 2**20, "seconds": 0.0123,
                                "busbw_gbytes_per_s": 2.71, "fitted_seconds": 0.0119}
                               for c in ("all_reduce", "all_gather", "reduce_scatter") for g in (2, 4)]}
    profile = {"name": "host-4xcpu", "measurements": {"machine": {"ranks": 4, "backend": "gloo", "cpu": "x86_64",
                                                                  "threads_per_rank": 1}}}
    for w in WIDTHS:
        width(w)
        print_result(result)
        print_summary({"profile": profile, "summary": summary, "path": "runs/host.yaml"})
        out = capsys.readouterr().out
        assert_fits(out, w)
        toks = numbers(out)
        for text in ("1.2%", "1.5%", f"{0.035:+.0%}", "1.23", "0.1234", "1024", "2.71", "12.3", "11.9"):
            assert text in toks, text


# -- the hardware sheet -----------------------------------------------------------------------------------


def _leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


@pytest.mark.parametrize("name", sorted(catalog()) + sorted(cluster_presets()))
def test_hardware_sheet_is_readable_and_complete(name, capsys, width):
    width(80)
    out = run(capsys, ["hardware", name])
    obj = json_of(capsys, ["hardware", name])
    assert_fits(out, 80)
    for repr_text in ("{'", "{}", "[]", "None", "[{"):
        assert repr_text not in out, repr_text
    flat = "".join(out.split())
    toks = numbers(out)
    for v in _leaves(obj):
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float)):
            assert value_text(v) in toks, (name, v)
        else:
            assert "".join(str(v).split()) in flat, (name, v)  # strings whole, even wrapped or folded
    for k, v in obj.items():
        if v in (None, {}, []):
            assert MISSING in out, k  # missing, shown as missing
    assert next_commands(out)[0][:2] == ["dayzero", "plan"]


# -- help, --version, bare dayzero -----------------------------------------------------------------------


def _commands():
    import typer.main

    from dayzero.cli.app import app

    root = typer.main.get_command(app)
    out = [([], root)]
    for name, cmd in root.commands.items():
        out.append(([name], cmd))
        for sub, c in getattr(cmd, "commands", {}).items():
            out.append(([name, sub], c))
    return out


@pytest.mark.parametrize("path,cmd", _commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_help_fits_and_has_no_type_noise(path, cmd, capsys, width):
    width(80)
    out = run(capsys, path + ["--help"])
    assert_fits(out, 80)
    assert not re.search(r"<(bool|str|int|float|path|int range|float range)>", out, re.I), out
    assert "%%" not in out and out.startswith("Usage: ")
    flat = [w.strip(",") for w in out.split()]  # "--tp, --tensor-model-parallel-size INT"
    for param in cmd.params:
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("--"):
                assert opt in flat, f"{opt} cut or missing"
    for p in cmd.params:  # a flag is shown bare, a valued option with a plain metavar
        long = [o for o in p.opts if o.startswith("--")]
        if not long:
            continue
        options = out[out.index("\nOptions\n"):].splitlines()
        line = next(line for line in options if long[0] in [w.strip(",") for w in line.split()[:2]])
        after = line.split(long[-1], 1)[1].split()  # the metavar follows the last alias
        if getattr(p, "is_flag", False):
            assert not after or not after[0].isupper(), line
        else:
            assert after and (after[0].isupper() or after[0].startswith("[")), line


WRITERS = re.compile(r"(?:--out|-o|--metrics|--timeline|--ckpt-dir|--write-calibration|--profile-out) (\S+)")


def test_help_examples_write_under_runs_or_tmp():
    """Examples never write into the directory the user stands in (the repository root)."""
    from rich.text import Text

    for path, cmd in _commands():
        doc = Text.from_markup(cmd.help or "").plain
        for target in WRITERS.findall(doc):
            if target.isupper():  # a metavar in prose (--ckpt-dir ROOT), not an example
                continue
            assert target.startswith(("runs/", "/tmp/")), (path, target)


def test_version(capsys):
    from importlib.metadata import version

    out = run(capsys, ["--version"])
    assert out.strip() == f"dayzero {package_version()}" == f"dayzero {version('dayzero')}"


def test_bare_dayzero_prints_help_and_exits_0(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert "Usage:" in out and "Commands" in out and "plan" in out
    assert err == "" and "dayzero: error" not in out
    assert main(["ckpt"]) == 0 and "export" in capsys.readouterr().out


# -- next commands, built from the values printed ---------------------------------------------------


def test_plan_ends_with_memory_and_train_of_the_best_plan(capsys, width):
    width(80)
    argv = ["plan", "llama-3.1-8b", "-a", "h100", "-n", "8", "--gbs", "64"]
    best = json_of(capsys, argv)["plans"][0]["parallel"]
    memory, train = next_commands(run(capsys, argv))
    assert train[:3] == ["dayzero", "train", "llama-3.1-8b"] and train[-2:] == ["--nproc", "8"]
    for k in ("tp", "pp", "dp", "mbs", "gbs", "seq", "zero"):
        assert train[train.index(f"--{k}") + 1] == str(best[k])
    got = json_of(capsys, memory[1:])  # the suggested command runs, on the same layout
    for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs", "seq", "zero", "recompute", "sequence_parallel"):
        assert got["parallel"][k] == best[k], k


def test_a_big_plan_trains_under_torchrun_on_every_node(capsys, width):
    width(80)
    train = next_commands(run(capsys, ["plan", "--top", "1", "--engine", "dayzero"]))[1]
    assert train[:7] == ["torchrun", "--nnodes", "1024", "--nproc-per-node", "8", "-m", "dayzero"]
    # the default plan (on Ascend 910B: searched for MindSpeed, planner.engines.default_engine) is not the
    # runtime's: its launch is exported for MindSpeed-LLM
    export = next_commands(run(capsys, ["plan", "--top", "1"]))[1]
    assert export[:5] == ["dayzero", "export", "dense-3t", "--to", "mindspeed"] and "--devices" in export


def test_memory_that_does_not_fit_says_which_flags_to_change(capsys, width):
    width(80)
    argv = ["memory", "llama-3.1-70b", "-a", "h100", "-n", "64", "--tp", "8", "--gbs", "64", "--no-simulate"]
    assert json_of(capsys, argv)["within_target"] is False
    out = run(capsys, argv)
    assert "with one change: --zero 2" in out  # 80 GiB per H100: sharding gradients too is enough
    suggested, search = next_commands(out)
    fixed = json_of(capsys, suggested[1:])
    assert fixed["within_target"] is True and fixed["parallel"]["zero"] == 2
    assert search[:3] == ["dayzero", "plan", "llama-3.1-70b"] and "--gbs" in search
    fits = next_commands(run(capsys, suggested[1:]))[0]
    assert fits[:2] == ["dayzero", "predict"]  # and once it fits: its step time


def test_inspect_and_models_point_at_the_next_verb(capsys, width):
    width(80)
    (plan,) = next_commands(run(capsys, ["inspect", "llama-3.1-8b"]))
    assert plan[:3] == ["dayzero", "plan", "llama-3.1-8b"] and "--devices" in plan
    assert json_of(capsys, plan[1:] + ["--top", "1"])["plans"]  # the suggestion is a plan that exists
    first = json_of(capsys, ["models"])["models"][0]["name"]
    assert next_commands(run(capsys, ["models"])) == [["dayzero", "inspect", first]]


def test_next_lines_fit_and_paste_into_a_shell(capsys, width):
    width(80)
    out = run(capsys, VERB_ARGS[11])
    tail = out[out.index("next: "):]
    assert_fits(tail, 80)
    cmds = next_commands(out)
    assert all(c[0] in ("dayzero", "torchrun") for c in cmds)


# -- exported files get ordinary modes ---------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_ckpt_export_files_follow_the_umask(umask, tmp_path, capsys, width):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from dayzero.runtime.checkpoint.checkpointer import Checkpointer

    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))  # 128 + 32 + 96 + 12 bytes
    ck = Checkpointer(tmp_path / "ck", model_name="toy", layout={"tp": 1, "dp": 1})
    ck.save(1, m, torch.optim.AdamW(m.parameters()))
    version = next((tmp_path / "ck").glob("step-*"))
    old = os.umask(umask)
    try:
        width(80)
        out = run(capsys, ["ckpt", "export", str(version), str(tmp_path / "hf"), "--shard-gb", "1e-7"])
    finally:
        os.umask(old)
    files = list((tmp_path / "hf").iterdir())
    assert len([f for f in files if f.suffix == ".safetensors"]) >= 2  # sharded: every shard checked
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f.name
    (imp,) = next_commands(out)
    assert imp[:4] == ["dayzero", "ckpt", "import", str(tmp_path / "hf")]
    listing = run(capsys, ["ckpt", "list", str(tmp_path / "ck")])
    assert_fits(listing[:listing.index("next: ")], 80)  # (a path longer than a line stays one word)
    assert next_commands(listing)[0][:4] == ["dayzero", "ckpt", "export", str(version)]


# -- the real thing: a pipe, COLUMNS=80 -------------------------------------------------------------


@pytest.mark.slow
def test_piped_output_at_80_columns():
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME")}
    env["COLUMNS"] = "80"
    for argv in (VERB_ARGS[9], ["hardware"], ["plan", "--help"]):
        p = subprocess.run([sys.executable, "-m", "dayzero", *argv], capture_output=True, text=True, env=env,
                           stdin=subprocess.DEVNULL, timeout=300)
        assert p.returncode == 0, p.stderr
        assert_fits(p.stdout, 80)
        assert "next: " in p.stdout or argv[-1] == "--help"


def test_train_ends_with_the_export_of_its_newest_checkpoint(tmp_path, capsys, width):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    width(80)
    corpus = tmp_path / "text.txt"
    corpus.write_text("a small text for a small test. " * 40)
    args = ["train", "tiny-llama", "--steps", "2", "--seq", "32", "--gbs", "2", "--hidden", "64", "--layers", "2",
            "--quiet", "--data", str(corpus)]
    out = run(capsys, args + ["--ckpt-dir", str(tmp_path / "ck")])
    (export,) = next_commands(out)
    assert export[:3] == ["dayzero", "ckpt", "export"] and Path(export[3]).name == "step-00000002"
    assert "next:" in run(capsys, export[1:])  # the suggested export works, and says what follows
    (validate,) = next_commands(run(capsys, args))
    assert validate[:3] == ["dayzero", "validate", "tiny-llama"]
    assert validate[validate.index("--layers") + 1] == "2" and validate[validate.index("--nproc") + 1] == "1"
