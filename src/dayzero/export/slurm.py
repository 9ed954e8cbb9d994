"""Slurm: an ``sbatch`` script that runs a plan on dayzero's runtime or an engine's launch
(Megatron-LM's ``pretrain_gpt.py``, ``torchtitan.train``, a DeepSpeed script:
:func:`dayzero.export.job.launch`), requeues itself after a failure and resumes from the newest
good checkpoint.

One ``srun`` task per node starts ``torchrun`` with a c10d rendezvous on the first node of the
allocation (DeepSpeed: its launcher with ``--no_ssh`` and the node's rank); every rank runs
``dayzero train ... --ckpt-dir RUN/ckpt --resume auto`` or the engine's script with the same
checkpoint directory, interval and step count. Every value in the script is quoted by
:mod:`dayzero.export.quoting`. Option names
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

from dayzero.errors import ConfigError, LayoutError
from dayzero.export.common import Export
from dayzero.export.job import (
    COMM_ENV,
    MEGATRON_HOME,
    NODE_SETUP,
    TORCHTITAN_CONFIG,
    JobOptions,
    Launch,
    Paths,
    job_env,
    launch,
    node_split,
)
from dayzero.export.quoting import Ref, comment, refuse_control, sbatch_value, shell_line, shell_word
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

SCRIPT_FILE = "dayzero.sbatch"
HEREDOC_END = "DAYZERO_END_OF_FILE"  # a quoted here-document delimiter: the text above it is not expanded
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


# the variables the script sets, the only ones a word the exporter built may expand (quoting.Ref)
SCRIPT_VARS = frozenset(("SLURM_NNODES", "SLURM_JOB_ID", "SLURM_NODEID", "MASTER_ADDR", "MASTER_PORT", "RUN_DIR",
                         "CKPT_DIR", "METRICS", "ENGINE_FILES", MEGATRON_HOME, TORCHTITAN_CONFIG))
SOURCE = {"--job-name": "--job-name", "--partition": "--partition", "--time": "--time", "--exclude": "--exclude",
          "--output": "--run-dir"}  # the export option each #SBATCH value comes from


def node_command(launch: Launch, per_node: int) -> list[str]:
    """The command ``srun`` starts once per node: torchrun with a c10d rendezvous on the first node,
    or DeepSpeed's launcher without ssh (``--no_ssh``: each node starts its own ranks, told its
    rank in the allocation, ``SLURM_NODEID``, and the first node's address; deepspeed/launcher/runner.py)."""
    if launch.launcher == "deepspeed":
        return ["deepspeed", "--no_ssh", Ref("--node_rank=$SLURM_NODEID"), Ref("--master_addr=$MASTER_ADDR"),
                Ref("--master_port=$MASTER_PORT"), Ref("--num_nodes=$SLURM_NNODES"), f"--num_gpus={per_node}",
                *launch.program]
    return ["torchrun", Ref("--nnodes=$SLURM_NNODES"), f"--nproc-per-node={per_node}", Ref("--rdzv-id=$SLURM_JOB_ID"),
            "--rdzv-backend=c10d", Ref("--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT"), *launch.program]


def script(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions, model_config: dict | None = None) -> str:
    split = node_split(parallel, job.devices_per_node, "Slurm")
    return _script(spec, parallel, job, split, _launch(spec, parallel, job, model_config))


def _launch(spec, parallel, job, model_config) -> Launch:
    return launch(spec, parallel, job, Paths(ckpt="$CKPT_DIR", metrics="$METRICS", files="$ENGINE_FILES",
                                             style="shell"), model_config)


def _script(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions, split, run: Launch) -> str:
    q = shell_word
    command = node_command(run, split.per_node)
    lines = ["#!/bin/bash",
             comment(f"{spec.name} {parallel.describe()} on {split.nodes} node(s) x {split.per_node} {job.device} "
                     f"rank(s), {job.engine}:", "the model name"),
             "# written by `dayzero export --to slurm`; submit with `sbatch " + SCRIPT_FILE + "`"]
    lines += [f"#SBATCH {k}" if v is None else f"#SBATCH {k}={sbatch_value(SOURCE.get(k, k), v)}"
              for k, v in sbatch_options(split, job)]
    lines += ["set -uo pipefail", "",
              "# on the shared file system: every node reads and writes the same checkpoints",
              f"RUN_DIR={q(job.run_dir.rstrip('/'), '--run-dir')}", 'CKPT_DIR="$RUN_DIR/ckpt"',
              'METRICS="$RUN_DIR/metrics.jsonl"', "export RUN_DIR CKPT_DIR METRICS  # srun passes them to the nodes",
              f"MAX_REQUEUES={job.max_requeues}", 'mkdir -p "$CKPT_DIR"', "",
              "# torchrun's c10d rendezvous on the allocation's first node",
              'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"MASTER_PORT=${{MASTER_PORT:-{RDZV_PORT}}}", "export MASTER_ADDR MASTER_PORT"]
    for k, v in COMM_ENV[job.device].items():  # the device's defaults yield to the site's environment
        lines.append(f'export {k}="${{{k}:-{v}}}"')
    lines += [f"export {k}={q(v, '--rank-table')}" for k, v in job_env(job).items()]  # what the job gives is set
    lines += node_setup_lines(job, split.per_node)
    lines += engine_lines(run)
    step = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if run.launcher == "deepspeed":  # SLURM_NODEID differs per node: expanded by each task's shell, not here
        inner = shell_line(command, "a launch argument", SCRIPT_VARS)
        node = " ".join(step) + " bash -c " + shell_word(inner, "a launch argument")
    else:
        node = " ".join(step) + " \\\n    " + shell_line(command, "a launch argument", SCRIPT_VARS)
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
              node + " &",
              "STEP=$!",
              'wait "$STEP"',
              "rc=$?",
              'if [ "$rc" -ne 0 ]; then',
              '    requeue "step exited $rc"',
              "fi",
              'exit "$rc"', ""]
    return "\n".join(lines)


def engine_lines(run: Launch) -> list[str]:
    """What an engine's launch needs before it starts: the site's variables with their defaults
    (the Megatron-LM checkout; torchtitan's registry function, which has no default: the job stops
    with that sentence if it is unset) and the engine's files, written into the run directory from
    here-documents whose delimiter is quoted (their text is not expanded)."""
    lines = []
    for name, default in run.env.items():
        if default:
            lines.append(f"{name}=${{{name}:-{shell_word(default)}}}")
        else:
            lines.append(f': "${{{name}:?set {name} to the config of this model, as the engine names it}}"')
        lines.append(f"export {name}")
    if run.files:
        lines += ["# the engine's files, beside the checkpoints", 'ENGINE_FILES="$RUN_DIR/engine"',
                  "export ENGINE_FILES", 'mkdir -p "$ENGINE_FILES"']
        for name, text in run.files.items():
            body = text if text.endswith("\n") else text + "\n"
            if any(line == HEREDOC_END for line in body.splitlines()):
                raise ConfigError(name, None, f"holds a line {HEREDOC_END!r}, which would end its here-document")
            refuse_control(name, body.replace("\n", ""))
            lines += [f"cat > \"$ENGINE_FILES/{name}\" <<'{HEREDOC_END}'", *body.splitlines(), HEREDOC_END]
    return lines


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
           job: JobOptions | None = None, model_config: dict | None = None) -> Export:
    """The sbatch script of ``parallel`` (``nodes`` follows from the devices per node), launching
    ``job.engine`` on every node."""
    job = job or JobOptions(devices_per_node=devices_per_node)
    split = node_split(parallel, job.devices_per_node, "Slurm")
    if nodes is not None and nodes != split.nodes:
        raise LayoutError(f"{parallel.world} ranks at {split.per_node} per node take {split.nodes} node(s), "
                          f"not {nodes}")
    run = _launch(spec, parallel, job, model_config)
    return Export("slurm", {SCRIPT_FILE: _script(spec, parallel, job, split, run)}, ["sbatch", SCRIPT_FILE],
                  run.unexpressed)
