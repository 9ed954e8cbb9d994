"""Slurm: an ``sbatch`` script that runs a plan on dayzero's runtime, requeues itself after a
failure and resumes from the newest good checkpoint.

One ``srun`` task per node starts ``torchrun`` with a c10d rendezvous on the first node of the
allocation; every rank runs ``dayzero train ... --ckpt-dir RUN/ckpt --resume auto``. Option names
are sbatch's (https://slurm.schedmd.com/sbatch.html). Requeue works without slurmdbd:

* a failed step (a killed rank, a lost node's step): the script runs ``scontrol requeue
  $SLURM_JOB_ID`` (needs ``JobRequeue=1`` or ``--requeue``, and at most ``--max-requeues`` times,
  counted by ``SLURM_RESTART_COUNT``); the requeued job starts the script again and ``dayzero
  train`` resumes from the checkpoint, appending to the metrics with the next ``attempt``;
* the time limit: ``--signal=B:USR1@120`` tells the batch shell 120 s ahead; it stops the step
  (SIGTERM: ranks exit, an async save in flight is abandoned) and requeues;
* preemption (a partition with ``PreemptMode=REQUEUE``) and node failure: Slurm requeues the job
  itself because of ``--requeue``.
"""

from __future__ import annotations

import shlex

from dayzero.errors import LayoutError
from dayzero.export.common import Export
from dayzero.export.job import COMM_ENV, NODE_SETUP, JobOptions, job_env, node_split, train_args, unexpressed
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

SCRIPT_FILE = "dayzero.sbatch"
SIGNAL_LEAD_S = 120  # seconds before the time limit that the batch shell is warned (sbatch --signal)
RDZV_PORT = 29500  # torchrun's default master port (torch.distributed.run --master-port)

def sbatch_options(split, job: JobOptions) -> list[tuple[str, str | None]]:
    """The ``#SBATCH`` lines, as (option, value or None for a switch)."""
    run = job.run_dir.rstrip("/")
    o: list[tuple[str, str | None]] = [("--job-name", job.name), ("--nodes", str(split.nodes)),
                                       ("--ntasks-per-node", "1")]
    if job.device == "cuda":
        o.append(("--gpus-per-node", str(split.per_node)))
    elif job.device == "npu":
        o.append(("--gres", f"npu:{split.per_node}"))  # the site's gres.conf names the Ascend cards "npu"
    cpus = job.cpus_per_node or (split.per_node if job.device == "cpu" else None)
    if cpus:
        o.append(("--cpus-per-task", str(cpus)))
    o.append(("--mem", f"{job.memory_gb}G" if job.memory_gb else "0"))  # 0: all of each node's memory
    o += [("--exclusive", None), ("--requeue", None), ("--signal", f"B:USR1@{SIGNAL_LEAD_S}"),
          ("--open-mode", "append"), ("--output", f"{run}/slurm-%j.out")]
    if job.partition:
        o.append(("--partition", job.partition))
    if job.time_limit:
        o.append(("--time", job.time_limit))
    if job.exclude:
        o.append(("--exclude", ",".join(job.exclude)))
    return o


def script(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions) -> str:
    split = node_split(parallel, job.devices_per_node, "Slurm")
    run = job.run_dir.rstrip("/")
    q = shlex.quote
    train = train_args(spec, parallel, job, "$CKPT_DIR", "$METRICS")
    torchrun = ["torchrun", "--nnodes=$SLURM_NNODES", f"--nproc-per-node={split.per_node}",
                "--rdzv-id=$SLURM_JOB_ID", "--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT",
                "-m", *train]

    def word(w: str) -> str:  # the $VARIABLES the script sets stay expandable
        return f'"{w}"' if "$" in w else q(w)

    lines = ["#!/bin/bash",
             f"# {spec.name} {parallel.describe()} on {split.nodes} node(s) x {split.per_node} {job.device} rank(s):",
             "# written by `dayzero export --to slurm`; submit with `sbatch " + SCRIPT_FILE + "`"]
    lines += [f"#SBATCH {k}" if v is None else f"#SBATCH {k}={v}" for k, v in sbatch_options(split, job)]
    lines += ["set -uo pipefail", "",
              "# on the shared file system: every node reads and writes the same checkpoints",
              f"RUN_DIR={q(run)}", 'CKPT_DIR="$RUN_DIR/ckpt"', 'METRICS="$RUN_DIR/metrics.jsonl"',
              f"MAX_REQUEUES={job.max_requeues}", 'mkdir -p "$CKPT_DIR"', "",
              "# torchrun's c10d rendezvous on the allocation's first node",
              'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"MASTER_PORT=${{MASTER_PORT:-{RDZV_PORT}}}", "export MASTER_ADDR MASTER_PORT"]
    for k, v in COMM_ENV[job.device].items():  # the device's defaults yield to the site's environment
        lines.append(f'export {k}="${{{k}:-{v}}}"')
    lines += [f"export {k}={q(v)}" for k, v in job_env(job).items()]  # what the job gives is set
    lines += node_setup_lines(job, split.per_node)
    lines += ["",
              "requeue() {  # a failed or stopped step: run again from the newest good checkpoint",
              '    if [ "${SLURM_RESTART_COUNT:-0}" -lt "$MAX_REQUEUES" ]; then',
              '        echo "dayzero-slurm: $1: requeue (restart ${SLURM_RESTART_COUNT:-0} of $MAX_REQUEUES)"',
              '        scontrol requeue "$SLURM_JOB_ID"',
              "    else",
              '        echo "dayzero-slurm: $1: $MAX_REQUEUES requeues spent, giving up"',
              "    fi",
              "}",
              f"# {SIGNAL_LEAD_S} s before the time limit (--signal): stop the step, requeue",
              "trap 'kill -TERM \"$STEP\" 2>/dev/null; wait \"$STEP\"; requeue \"time limit near\"; exit 0' USR1",
              "",
              'echo "dayzero-slurm: job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST"',
              "srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
              "    " + " ".join(word(w) for w in torchrun) + " &",
              "STEP=$!",
              'wait "$STEP"',
              "rc=$?",
              'if [ "$rc" -ne 0 ]; then',
              '    requeue "step exited $rc"',
              "fi",
              'exit "$rc"', ""]
    return "\n".join(lines)


def node_setup_lines(job: JobOptions, per_node: int) -> list[str]:
    """The device's node set-up (:data:`dayzero.export.job.NODE_SETUP`) in the batch shell, which
    ``srun`` passes to every node's tasks (its default ``--export=ALL``)."""
    setup = NODE_SETUP[job.device]
    lines = []
    if setup.toolkit:
        var, path = setup.toolkit
        lines += [f"# the {job.device} toolkit's environment (libraries, paths), where the site has not loaded it",
                  f"{var}=${{{var}:-{path}}}",
                  f'if [ -f "${var}" ]; then source "${var}"; '
                  f'else echo "dayzero-slurm: ${var} not found; using the environment as it is"; fi']
    if setup.visible:
        cards = ",".join(str(i) for i in range(per_node))
        lines += ["# the cards each node's ranks use (torchrun's LOCAL_RANK picks one of them)",
                  f'export {setup.visible}="${{{setup.visible}:-{cards}}}"']
    return lines


def export(spec: ModelSpec, parallel: ParallelConfig, nodes: int | None = None, devices_per_node: int = 8,
           job: JobOptions | None = None) -> Export:
    """The sbatch script of ``parallel`` (``nodes`` follows from the devices per node)."""
    job = job or JobOptions(devices_per_node=devices_per_node)
    split = node_split(parallel, job.devices_per_node, "Slurm")
    if nodes is not None and nodes != split.nodes:
        raise LayoutError(f"{parallel.world} ranks at {split.per_node} per node take {split.nodes} node(s), "
                          f"not {nodes}")
    return Export("slurm", {SCRIPT_FILE: script(spec, parallel, job)}, ["sbatch", SCRIPT_FILE],
                  unexpressed(parallel))
