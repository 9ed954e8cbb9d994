"""What the trainer does when an in-process alert fires: log, checkpoint now, restart, exclude.

``--on-alert NAME=ACTION`` (repeatable; ``all=ACTION`` sets the default) maps an alert to one of

- ``log`` (the default for every alert): rank 0 writes an ``alert`` event to the metrics stream
  and one ``dayzero: alert ...`` line on stderr; training goes on;
- ``checkpoint``: also save a checkpoint now (needs ``--ckpt-dir``);
- ``restart``: save a checkpoint now, then every rank exits :data:`RESTART_EXIT` so the launcher
  restarts the job on the same ranks from that checkpoint;
- ``exclude``: as ``restart``, after writing the alert's offending ranks to the run's exclusion
  list (:mod:`dayzero.runtime.resilience.exclusion`); the launcher restarts without them (on
  spares, or with dp reduced). An alert that names no rank is handled as ``restart``.

Restarts are dayzero's launcher's (``--nproc``): they count against ``--max-restarts``. Under
your own torchrun or a cluster scheduler the ranks exit :data:`RESTART_EXIT` and rank 0 leaves
``restart_plan.json`` (the excluded hosts as Slurm ``--exclude`` and as a Kubernetes node
affinity, the reduced layout) next to the exclusion list for the job script to apply.

The alerts are the monitor's (:class:`dayzero.runtime.monitoring.Monitor`: the rules of
:mod:`dayzero.monitor.rules` over every rank's gathered figures; ``--on-alert`` turns them on). An
action follows an alert when it begins firing, not on every step it stays active. Consistency:
rank 0 alone decides, from its alerts, and broadcasts the decision, so all ranks save and stop
together at the same step.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from dayzero.errors import DayzeroError
from dayzero.runtime.resilience import rank_log
from dayzero.runtime.resilience.exclusion import reshape, restart_plan
from dayzero.specs.exclusions import Exclusion, ExclusionError, add_exclusions, exclusion_path

ACTIONS = ("log", "checkpoint", "restart", "exclude")  # weakest first: one step's strongest wins
DEFAULT_ACTION = "log"
# every rank's exit after a checkpoint for a planned restart (dayzero's own code: 64-78 are
# sysexits.h's, 75 the watchdog's; 128+ are signals)
RESTART_EXIT = 86
REQUEST_FILE = "restart_request.json"  # in the launch directory: what rank 0 asked the launcher for
PLAN_FILE = "restart_plan.json"  # in the checkpoint directory, for cluster job scripts


class AlertPolicyError(DayzeroError):
    """A malformed or unusable --on-alert value."""


class PlannedRestart(Exception):
    """Raised on every rank after an alert's restart or exclude action saved its checkpoint."""

    def __init__(self, action: str, step: int):
        super().__init__(f"{action} at step {step}")
        self.action, self.step = action, step


class AlertLike(Protocol):
    """An alert: its rule's name, the offending ranks (may be empty) and a one-line message."""

    name: str
    ranks: tuple[int, ...]
    message: str


@dataclass(frozen=True)
class AlertPolicy:
    actions: tuple[tuple[str, str], ...] = ()  # (alert name, action)
    default: str = DEFAULT_ACTION

    @classmethod
    def parse(cls, items: Sequence[str], known: Sequence[str] | None = None) -> "AlertPolicy":
        """``["straggler=exclude", "all=checkpoint"]`` -> AlertPolicy; ``known``: the alert names
        that exist (a typo is refused, not silently ignored)."""
        usage = f"expected NAME=ACTION with ACTION one of {'|'.join(ACTIONS)} (NAME all: every other alert)"
        pairs, default = {}, DEFAULT_ACTION
        for item in items:
            name, sep, action = (s.strip() for s in str(item).partition("="))
            if not sep or not name or action not in ACTIONS:
                raise AlertPolicyError(f"--on-alert {item!r}: {usage}")
            if known is not None and name != "all":
                found = resolve_name(name, known)
                if found is None:
                    raise AlertPolicyError(f"--on-alert {item!r}: no single alert named {name!r}; alerts: "
                                           f"{', '.join(known)}")
                name = found
            if name in pairs or (name == "all" and default != DEFAULT_ACTION):
                raise AlertPolicyError(f"--on-alert {item!r}: {name} is given twice")
            if name == "all":
                default = action
            else:
                pairs[name] = action
        return cls(tuple(sorted(pairs.items())), default)

    def action_for(self, alert: AlertLike) -> str:
        action = dict(self.actions).get(alert.name, self.default)
        return "restart" if action == "exclude" and not alert.ranks else action

    def uses(self, *actions: str) -> bool:
        return any(a in actions for a in (self.default, *dict(self.actions).values()))


def check_alert_options(cfg, torchrun: bool, world: int) -> AlertPolicy:
    """The ``--on-alert`` policy of a TrainConfig, refusing what this run cannot carry out
    (before any rank starts): ``torchrun``: ranks of the user's own torchrun; ``world``: ranks."""
    fa = cfg.faults
    policy = AlertPolicy.parse(fa.on_alert, alert_names())
    if fa.on_rank_failure not in ("restart", "exclude"):
        raise AlertPolicyError(f"--on-rank-failure {fa.on_rank_failure}: expected restart or exclude")
    excluding = fa.on_rank_failure == "exclude"
    if excluding and (torchrun or world == 1 or fa.max_restarts < 1 or not cfg.checkpoint.dir):
        raise AlertPolicyError("--on-rank-failure exclude needs dayzero to start the ranks (--nproc N, N >= 2), "
                               "--max-restarts N (N >= 1) and --ckpt-dir")
    if fa.spares and (torchrun or world == 1):
        raise AlertPolicyError(f"--spares {fa.spares} applies only when dayzero starts the ranks (--nproc N, N >= 2)")
    if fa.spares and not (policy.uses("exclude") or excluding):
        raise AlertPolicyError(f"--spares {fa.spares}: spares replace excluded ranks; add --on-alert NAME=exclude "
                               "or --on-rank-failure exclude")
    if policy.uses("checkpoint", "restart", "exclude") and not cfg.checkpoint.dir:
        raise AlertPolicyError("--on-alert checkpoint|restart|exclude needs --ckpt-dir (the checkpoint it saves and "
                               "resumes from)")
    if policy.uses("restart", "exclude") and not torchrun:
        if world == 1:
            raise AlertPolicyError("--on-alert restart|exclude needs ranks to relaunch: --nproc N (N >= 2), or your "
                                   "own torchrun/cluster launcher")
        if fa.max_restarts < 1:
            raise AlertPolicyError("--on-alert restart|exclude restarts the job: add --max-restarts N (N >= 1; each "
                                   "planned restart counts)")
    return policy


@dataclass(frozen=True)
class Decision:
    action: str  # the strongest action of the step's alerts
    alerts: tuple  # the alerts that fired (rank 0 only; empty elsewhere)

    @property
    def checkpoint(self) -> bool:
        return self.action in ("checkpoint", "restart", "exclude")

    @property
    def stop(self) -> bool:
        return self.action in ("restart", "exclude")


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs: its host and local device slot."""

    host: str
    slot: int


def this_place() -> RankPlace:
    from dayzero.runtime.distributed import device_slot

    return RankPlace(socket.gethostname(), device_slot())


class AlertActions:
    """One run's alert actions; the loop calls :meth:`after_step` on every rank after every step.

    ``broadcast(code)`` gives every rank rank 0's int (a torch collective in the trainer, a plain
    function in tests); ``places`` is every rank's :class:`RankPlace`, in rank order."""

    def __init__(self, policy: AlertPolicy, *, rank: int, places: Sequence[RankPlace],
                 broadcast: Callable[[int], int], emit: Callable[[dict], None], ckpt_dir: str | None = None,
                 parallel=None):
        self.policy, self.rank, self.places = policy, rank, tuple(places)
        self._broadcast, self._emit = broadcast, emit
        self.ckpt_dir, self.parallel = ckpt_dir, parallel
        self._active: set[str] = set()  # the alerts firing after the previous step (rank 0's)

    def after_step(self, step: int, alerts: Sequence[AlertLike]) -> Decision:
        """Every rank, with the alerts firing after ``step`` (only rank 0's are read): the
        strongest action of those that began firing, the same on every rank."""
        new: tuple = ()
        code = 0
        if self.rank == 0:
            new = tuple(a for a in alerts if a.name not in self._active)
            self._active = {a.name for a in alerts}
            for a in new:
                code = max(code, ACTIONS.index(self.policy.action_for(a)))
        code = self._broadcast(code)
        decision = Decision(ACTIONS[code], new)
        if self.rank == 0:
            for a in new:
                self._report(a, step)
            if decision.action == "exclude":
                self._exclude(decision, step)
        return decision

    def planned_restart(self, decision: Decision, step: int) -> PlannedRestart:
        """After the checkpoint is saved: rank 0 leaves the launcher its request; every rank gets
        the exception that ends its run with :data:`RESTART_EXIT`."""
        launch_dir = os.environ.get(rank_log.DIR_ENV)
        if self.rank == 0 and launch_dir:
            req = {"action": decision.action, "step": step,
                   "alerts": [{"name": a.name, "ranks": list(a.ranks), "message": a.message} for a in decision.alerts]}
            Path(launch_dir, REQUEST_FILE).write_text(json.dumps(req) + "\n")
        if self.rank == 0:
            print(f"dayzero: {decision.action} at step {step}: checkpoint saved; stopping every rank for a restart",
                  file=sys.stderr, flush=True)
        return PlannedRestart(decision.action, step)

    # -- rank 0 ------------------------------------------------------------------------------
    def _report(self, alert: AlertLike, step: int) -> None:
        """The monitor has logged the alert itself; this is what is done about it."""
        action = self.policy.action_for(alert)
        if action == "log":
            return
        ranks = f" (rank{'s' * (len(alert.ranks) > 1)} {', '.join(map(str, alert.ranks))})" if alert.ranks else ""
        print(f"dayzero: alert {alert.name} at step {step}{ranks}: action {action}", file=sys.stderr, flush=True)
        self._emit({"event": "alert_action", "step": step, "name": alert.name, "ranks": list(alert.ranks),
                    "action": action})

    def _exclude(self, decision: Decision, step: int) -> None:
        assert self.ckpt_dir is not None  # check_policy requires it
        now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        new = [Exclusion(rank=r, slot=self.places[r].slot, host=self.places[r].host, reason=a.name, step=step,
                         time=now, message=a.message)
               for a in decision.alerts if self.policy.action_for(a) == "exclude" for r in a.ranks
               if 0 <= r < len(self.places)]
        entries = add_exclusions(exclusion_path(self.ckpt_dir), new)
        self._emit({"event": "excluded", "step": step, "ranks": sorted({e.rank for e in new}),
                    "slots": sorted({e.slot for e in new}), "hosts": sorted({e.host for e in new}),
                    "path": str(exclusion_path(self.ckpt_dir))})
        # a cluster's view: global ranks stand for the devices (no spares known here)
        shaped = None
        if self.parallel is not None:
            try:
                shaped = reshape(self.parallel, tuple(range(len(self.places))), (),
                                 frozenset(e.rank for e in new))
            except ExclusionError:
                shaped = None
        Path(self.ckpt_dir, PLAN_FILE).write_text(json.dumps(restart_plan(entries, shaped), indent=1) + "\n")


def alert_names() -> tuple[str, ...]:
    """The alerts the monitor's rule evaluator raises (:mod:`dayzero.monitor.rules`)."""
    from dayzero.monitor.rules import rule_names

    return rule_names()


def _norm(name: str) -> str:
    n = name.lower().replace("_", "").replace("-", "")
    return n[len("dayzero"):] if n.startswith("dayzero") else n


def resolve_name(token: str, known: Sequence[str]) -> str | None:
    """An alert's name from what a user typed: the rule's name (``DayzeroStragglerRank``), or
    case-, underscore- and prefix-insensitively a unique start of it (``straggler``,
    ``loss_spike``); None when nothing or several match."""
    t = _norm(token)
    exact = [k for k in known if _norm(k) == t]
    if exact:
        return exact[0]
    hits = [k for k in known if t and _norm(k).startswith(t)]
    return hits[0] if len(hits) == 1 else None


def read_request(launch_dir: str | Path) -> dict | None:
    """The restart rank 0 asked for in this attempt (None: the ranks failed on their own)."""
    p = Path(launch_dir, REQUEST_FILE)
    if not p.is_file():
        return None
    try:
        from dayzero.inputs import read_text

        return json.loads(read_text(p, limit=1 << 16))
    except ValueError:
        return None


def build_alert_actions(config, state, emit: Callable[[dict], None]) -> AlertActions | None:
    """The alert actions of a runtime TrainState (None without ``--on-alert``): the broadcast a
    torch collective on the state's device, every rank's place gathered once."""
    if not config.faults.on_alert:
        return None
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    places: list = [this_place()] * world
    if world > 1:
        dist.all_gather_object(places, this_place())

    def broadcast(code: int) -> int:
        t = torch.tensor([code], dtype=torch.int64, device=state.device)
        if world > 1:
            dist.broadcast(t, src=0)
        return int(t.item())

    return AlertActions(AlertPolicy.parse(config.faults.on_alert, alert_names()), rank=rank, places=places,
                        broadcast=broadcast, emit=emit, ckpt_dir=config.checkpoint.dir, parallel=config.parallel)
