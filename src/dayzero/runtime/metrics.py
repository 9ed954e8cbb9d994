"""Per-step measurements and the JSONL metrics stream.

One record per step, exactly these keys (``dayzero validate`` and the checkpoint tools read them):

    step, loss, grad_norm, lr, tokens, step_time_s, tokens_per_s, peak_mem_bytes, comm_time_s

and, in an MoE run, ``moe`` (per MoE layer, over the step's global batch: ``layers`` the global
layer indices, ``max_mean`` max/mean routed slots per expert, ``cv`` their coefficient of
variation, ``dropped`` the dropped share of routed slots (0.0 dropless), ``rank_max_mean`` max/mean
rows per EP rank), plus ``expert_loads`` (per MoE layer, the routed slots of each expert summed
over all ranks: a list of lists of ints) every ``--moe-loads-every`` steps and on the last step;
then one ``{"event": "end", ...}`` record. Every record also has ``attempt`` (see MetricsWriter), and
a record with a non-finite value writes it as ``null`` and names it in ``nonfinite``. ``peak_mem_bytes`` is the largest
over ranks of the
accelerator's max allocated bytes, or of the process's peak resident set size on CPU. ``comm_time_s`` is the
largest over ranks of the wall time during which at least one collective or point-to-point
transfer was in flight (the union of their intervals), read from the PyTorch profiler: on CPU
gloo's ``gloo:*`` work items, on an accelerator its communication library's kernels
(:func:`dayzero.runtime.device.is_comm_event`). A single process has no collectives and reports 0 without profiling.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dayzero.jsonable import record_line
from dayzero.runtime.device import is_comm_event, peak_allocated_bytes, profiler_activities

STEP_KEYS = ("step", "loss", "grad_norm", "lr", "tokens", "step_time_s", "tokens_per_s", "peak_mem_bytes",
             "comm_time_s")


@dataclass(frozen=True)
class StepRecord:
    step: int  # 1-based: the number of optimizer steps taken
    loss: float
    grad_norm: float
    lr: float
    tokens: int
    step_time_s: float
    tokens_per_s: float
    peak_mem_bytes: int
    comm_time_s: float
    moe: dict | None = None  # MoE runs: the per-layer load summary (module docstring)
    expert_loads: list | None = None  # every --moe-loads-every steps: [layer][expert] routed slots

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k in STEP_KEYS}


def peak_memory_bytes(device: torch.device) -> int:
    return peak_allocated_bytes(device)


class CommTimer:
    """Time inside communication during one step, from the profiler's trace.

    Enabled only with more than one rank (a single process has nothing to measure and pays no
    profiling overhead)."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled, self.device = enabled, device
        self.seconds = 0.0
        self._prof = None

    def start(self) -> None:
        self.seconds = 0.0
        if self.enabled:
            import os

            from torch.profiler import profile

            # kineto prints two lines per trace on stderr unless its log level is raised
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
            self._prof = profile(activities=profiler_activities(self.device))
            self._prof.__enter__()

    def stop(self, window_ns: tuple[int, int] | None = None) -> float:
        """Stop recording and return the seconds spent communicating within ``window_ns`` (the
        step's wall-clock span, ``time.time_ns()``). Call after the step's clock has stopped:
        collecting the trace is not part of the step."""
        if self._prof is None:
            return 0.0
        self._prof.__exit__(None, None, None)
        spans = []
        backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else ""
        # raw kineto events: building FunctionEvent trees with .events() costs more than a step
        for e in self._prof.profiler.kineto_results.events():
            if is_comm_event(self.device, e.name(), e.device_type().name, backend):
                a, b = e.start_ns(), e.end_ns()
                if window_ns is not None:
                    a, b = max(a, window_ns[0]), min(b, window_ns[1])
                if b > a:
                    spans.append((a, b))
        self._prof = None
        self.seconds = union_ns(spans) / 1e9
        return self.seconds


def union_ns(spans: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals: overlapping transfers (a pipeline's posted
    receives, collectives on several streams) count once, so the total never exceeds the step."""
    total, cur_start, cur_end = 0, None, None
    for a, b in sorted(spans):
        if cur_end is None or a > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


class MetricsWriter:
    """Appends one strict-JSON object per line (non-finite values as ``null``, named under
    ``nonfinite``); only rank 0 writes. Every record carries ``attempt``: 1 for a new stream, and
    one more than the stream's last attempt each time a resumed or restarted run appends to it, so
    steps that a restart repeats are told apart."""

    def __init__(self, path: str | Path | None, enabled: bool, append: bool = False):
        self.path = Path(path) if path and enabled else None
        self._f = None
        self.attempt = 1
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if append:  # a resumed or restarted run continues the stream of the run it continues
                self.attempt = last_attempt(self.path) + 1
            self._f = self.path.open("a" if append else "w", encoding="utf-8")

    def write(self, obj: dict) -> None:
        if self._f is None:
            return
        line = record_line({**obj, "attempt": self.attempt})
        try:
            self._f.write(line + "\n")
            self._f.flush()
        except OSError as e:  # a full or failed disk: records go to stderr from here on, the run goes on
            import sys

            print(f"dayzero: warning: cannot write {self.path} ({e.strerror or e}); its records follow on stderr",
                  file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                self._f.close()
            self._f = _Stderr()
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                self._f.close()
            self._f = None


class _Stderr:
    """Where a metrics stream goes once its file cannot be written."""

    def write(self, text: str) -> None:
        import sys

        sys.stderr.write(text)

    def flush(self) -> None:
        import sys

        sys.stderr.flush()

    def close(self) -> None:
        pass


def _records(path: str | Path):
    """The JSON objects of a metrics file, in order; a line that is not a JSON object (a record cut
    by a crash mid-write) is skipped."""
    from dayzero.inputs import jsonl_objects

    if not Path(path).exists():
        return
    yield from jsonl_objects(path, "a metrics stream (JSONL)")


def last_attempt(path: str | Path) -> int:
    """The largest ``attempt`` in a metrics file (a stream written before attempts were recorded,
    or an empty one, counts as attempt 1 when it has records, 0 when it has none)."""
    best = 0
    for obj in _records(path):
        a = obj.get("attempt", 1)
        best = max(best, a if isinstance(a, int) and not isinstance(a, bool) else 1)
    return best


def read_metrics(path: str | Path) -> tuple[list[dict], dict | None]:
    """(step records, end record) from a metrics file. Steps redone after a resume or restart
    appear twice in the stream; the later record is the one kept."""
    steps, end = [], None
    for obj in _records(path):
        if obj.get("event") == "end":
            end = obj
        elif "step" in obj and "event" not in obj:  # events (checkpoints, guards) also name steps
            steps.append(obj)
    last = {r["step"]: r for r in steps}
    return [last[s] for s in sorted(last)], end
