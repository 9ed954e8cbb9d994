"""What a scheduler needs beyond the layout: the job's nodes, devices, run directory and the
``dayzero train`` command its ranks run; shared by the Slurm and Kubernetes writers.

:func:`node_split` is where a plan the scheduler cannot lay out is refused: every node runs the
same number of ranks (``srun --ntasks-per-node``, ``torchrun --nproc-per-node``, a PyTorchJob's
identical replicas), and each tensor-parallel group stays inside one node (ranks are numbered node
by node and tp is the fastest-varying dimension, so ``devices_per_node % tp == 0`` keeps it there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dayzero.errors import ConfigError, LayoutError
from dayzero.export.quoting import Ref, refuse_control
from dayzero.specs.layout_fields import not_train_flags
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

DEVICES = ("cuda", "npu", "cpu")
ENGINES = ("dayzero", "megatron", "torchtitan", "deepspeed")  # what a scheduler's job can launch on each node
# Communication-library settings of the ranks (the Slurm script lets the site's environment override them):
COMM_ENV = {
    "cuda": {
        # a failed NCCL collective aborts the rank instead of hanging it, so the step fails and the job requeues
        # (https://pytorch.org/docs/stable/torch_nccl_environment_variables.html)
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        # NCCL's warnings (a lost peer, a bad interface) in the job log
        # (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-debug)
        "NCCL_DEBUG": "WARN",
    },
    "npu": {
        # seconds HCCL waits for every rank to connect (range 120-7200, default 120: short for a large job's
        # start, and shorter still with a rank table, where ranks do not negotiate; CANN environment
        # variables, HCCL_CONNECT_TIMEOUT: https://www.hiascend.com/document/detail/zh/CANNCommunityEdition/
        # 83RC1alpha003/maintenref/envvar/envref_07_0077.html; torch_npu RANK_TABLE_FILE:
        # https://www.hiascend.com/document/detail/zh/Pytorch/600/apiref/Envvariables/Envir_017.html)
        "HCCL_CONNECT_TIMEOUT": "1200",
    },
    "cpu": {},
}


@dataclass(frozen=True)
class NodeSetup:
    """What a node does before it starts its ranks, per device (the scheduler files render it).

    ``visible``: the variable that picks a node's cards, set to all of them unless the site set it
    (None: the scheduler sets it itself: Slurm's ``--gpus-per-node`` sets CUDA_VISIBLE_DEVICES;
    https://slurm.schedmd.com/gres.html). ``toolkit``: the vendor's environment script (libraries,
    paths), sourced where it exists, overridable by a variable of the same name."""

    visible: str | None = None
    toolkit: tuple[str, str] | None = None  # (shell variable, default path)


NODE_SETUP = {
    "cuda": NodeSetup(),
    # ASCEND_RT_VISIBLE_DEVICES: the cards a process sees (CANN's CUDA_VISIBLE_DEVICES; a generic Slurm gres
    # "npu" sets nothing); the CANN toolkit's set_env.sh at its default install path puts its libraries on
    # the paths (CANN environment variables: https://www.hiascend.com/document/detail/zh/canncommercial/
    # 82RC1/maintenref/envvar/envref_07_0121.html; the install path: torchtitan-npu's multi-node script,
    # https://gitcode.com/cann/torchtitan-npu/blob/v0.2.2-dev/scripts/run_train_multinodes.sh)
    "npu": NodeSetup(visible="ASCEND_RT_VISIBLE_DEVICES",
                     toolkit=("CANN_SET_ENV", "/usr/local/Ascend/ascend-toolkit/set_env.sh")),
    "cpu": NodeSetup(),
}


def job_env(job: JobOptions) -> dict[str, str]:
    """The communication settings the job itself gives: the HCCL rank table (torch_npu builds the
    global communicator from it, in a time about independent of the cluster's size, instead of
    negotiating through the rendezvous; Envir_017 above)."""
    return {"RANK_TABLE_FILE": job.rank_table} if job.rank_table else {}


def comm_env(job: JobOptions) -> dict[str, str]:
    """The ranks' communication settings: the device's defaults (:data:`COMM_ENV`), then the job's."""
    return {**COMM_ENV[job.device], **job_env(job)}


# a hostname, or a Slurm host range of one bracket group ("gpu[01-04,07]")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-_]*(\[[0-9,\-]+\][A-Za-z0-9.\-_]*)?")


@dataclass(frozen=True)
class JobOptions:
    """The job around a plan. ``run_dir`` is on the shared file system (checkpoints, metrics, logs);
    ``device`` is cuda, npu or cpu (CPU ranks on gloo); ``exclude`` the hosts to keep off."""

    name: str = "dayzero"
    devices_per_node: int = 8
    device: str = "cuda"
    run_dir: str = "runs/dayzero"
    steps: int = 100
    ckpt_every: int = 50
    max_requeues: int = 3
    partition: str | None = None
    time_limit: str | None = None
    exclude: tuple[str, ...] = ()
    memory_gb: int | None = None  # per node; None: Slurm gives the whole node, Kubernetes 32 GiB per device
    cpus_per_node: int | None = None  # None: Slurm gives the whole node, Kubernetes 4 cores per device
    image: str | None = None  # Kubernetes: the container image with dayzero installed
    volume_claim: str | None = None  # Kubernetes: the ReadWriteMany PersistentVolumeClaim holding run_dir
    rank_table: str | None = None  # npu: an HCCL rank table (JSON) on every node; None: torchrun's rendezvous
    engine: str = "dayzero"  # what every node launches: dayzero's runtime, or an engine's (ENGINES)
    data: str | None = None  # the training corpus on the shared file system; None: the engine's synthetic data
    model: str | None = None  # the MODEL the ranks load (a preset, or the config's path as given); None: spec.name

    def __post_init__(self):
        for flag, value in (("--job-name", self.name), ("--run-dir", self.run_dir), ("--partition", self.partition),
                            ("--time", self.time_limit), ("--image", self.image),
                            ("--volume-claim", self.volume_claim), ("--rank-table", self.rank_table),
                            ("--data", self.data), ("MODEL", self.model), *(("--exclude", h) for h in self.exclude)):
            if value is not None:
                refuse_control(flag, value)
        if self.engine not in ENGINES:
            raise ConfigError("--engine", None, f"must be {', '.join(ENGINES)}, got {self.engine!r}")
        if self.data is not None and not self.data.strip():
            raise ConfigError("--data", None, "give the corpus' path on the shared file system")
        for flag, n in (("--steps", self.steps), ("--ckpt-every", self.ckpt_every)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(flag, None, f"expected a whole number >= 1, got {n!r}")
        if self.device not in DEVICES:
            raise ConfigError("--device", None, f"must be {', '.join(DEVICES)}, got {self.device!r}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9\-_.]{0,62}", self.name):
            raise ConfigError("--job-name", None, f"{self.name!r}: letters, digits, '-', '_' and '.', at most 63")
        if self.time_limit is not None:
            time_limit_seconds(self.time_limit)
        if self.rank_table is not None and self.device != "npu":
            raise ConfigError("--rank-table", None, f"an HCCL rank table is for --device npu, not {self.device}")
        if self.rank_table is not None and not self.rank_table.strip():
            raise ConfigError("--rank-table", None, "give the rank table's path on the nodes")
        bad = [h for h in self.exclude if not _HOST.fullmatch(h)]
        if bad:
            raise ConfigError("--exclude", None, f"not a hostname or a host range like gpu[01-04]: {bad[0]!r}")


def time_limit_seconds(text: str) -> int:
    """Seconds of a Slurm time limit: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes or days-hours:minutes:seconds (https://slurm.schedmd.com/sbatch.html#OPT_time)."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m or text.strip() in ("0",):
        raise ConfigError("--time", None, f"{text!r}: expected minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]], above 0")
    days, a, b, c = m.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:
        return int(a) * 3600 + int(b) * 60 + int(c)
    return int(a) * 60 + int(b or 0)


@dataclass(frozen=True)
class NodeSplit:
    nodes: int
    per_node: int  # ranks (devices) per node


def node_split(parallel: ParallelConfig, devices_per_node: int, scheduler: str) -> NodeSplit:
    """Nodes x ranks per node for ``parallel``; a LayoutError says why ``scheduler`` cannot lay it out."""
    world = parallel.world
    per_node = min(world, devices_per_node)
    if world % per_node:
        raise LayoutError(f"{scheduler} cannot lay out {world} ranks on nodes of {devices_per_node}: every node runs "
                          f"the same number of ranks; use a device count that is a multiple of {devices_per_node} or "
                          "give --devices-per-node")
    if per_node % parallel.tp:
        raise LayoutError(f"{scheduler} cannot keep a tp {parallel.tp} group inside a node of {per_node} ranks; "
                          f"use tp dividing {per_node} or give --devices-per-node as a multiple of {parallel.tp}")
    return NodeSplit(world // per_node, per_node)


def hosts_to_exclude(path: str | Path) -> tuple[str, ...]:
    """Hosts to keep off: a run's ``exclusions.json`` (:mod:`dayzero.specs.exclusions`, written by
    the trainer's alert actions: every host with an excluded device slot), a JSON object with a
    ``hosts`` list (a restart plan), a JSON list, or plain text with one hostname per line (``#``
    comments)."""
    from dayzero.inputs import parse_json, read_text
    from dayzero.specs import exclusions

    text = read_text(path, "an exclusion list: JSON {\"hosts\": [...]} or one hostname per line")
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        obj = parse_json(text, str(path))
        if isinstance(obj, dict) and "format" in obj:
            try:
                hosts = exclusions.excluded_hosts(exclusions.read_exclusions(path))
            except exclusions.ExclusionError as e:
                raise ConfigError(str(path), None, str(e)) from None
        else:
            hosts = obj.get("hosts") if isinstance(obj, dict) else obj
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise ConfigError(str(path), "hosts", "expected a list of hostnames")
    else:
        hosts = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    hosts = [h.strip() for h in hosts if h.strip()]
    bad = [h for h in hosts if not _HOST.fullmatch(h)]
    if bad:
        raise ConfigError(str(path), "hosts", f"not a hostname: {bad[0]!r}")
    return tuple(dict.fromkeys(hosts))


def expand_hosts(hosts: tuple[str, ...]) -> list[str]:
    """Slurm host ranges as single hostnames: ``gpu[01-03,07]`` -> gpu01, gpu02, gpu03, gpu07 (a
    range keeps its zero padding; https://slurm.schedmd.com/sbatch.html#OPT_nodelist)."""
    out: list[str] = []
    for h in hosts:
        m = re.fullmatch(r"(.*)\[([0-9,\-]+)\](.*)", h)
        if not m:
            out.append(h)
            continue
        head, body, tail = m.groups()
        for part in body.split(","):
            lo, _, hi = part.partition("-")
            if not lo or (hi == "" and "-" in part) or (hi and int(hi) < int(lo)):
                raise ConfigError("--exclude", None, f"{h!r}: bad range {part!r}")
            out += [f"{head}{str(i).zfill(len(lo))}{tail}" for i in range(int(lo), int(hi or lo) + 1)]
    return list(dict.fromkeys(out))


def train_args(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions, ckpt_dir: str, metrics: str) -> list[str]:
    """``dayzero train`` of the plan, as every rank runs it (after ``-m``): resumes from the newest
    good checkpoint in ``ckpt_dir`` (``--resume auto``), appends to ``metrics``, reads ``job.data``."""
    from dayzero.specs.layout_flags import layout_flags, train_layout

    layout = layout_flags(train_layout(parallel.to_dict()))  # what train's flags cannot carry: see unexpressed
    out = ["dayzero", "train", job.model or spec.name, *layout, "--steps", str(job.steps),
           "--ckpt-dir", ckpt_dir, "--ckpt-every", str(job.ckpt_every), "--resume", "auto", "--metrics", metrics,
           "--quiet"]
    if job.data:
        out += ["--data", job.data]
    if job.device == "cpu":
        out += ["--device", "cpu", "--backend", "gloo"]
    elif job.device == "npu":
        out += ["--device", "npu"]
    return out


@dataclass(frozen=True)
class Paths:
    """Where a scheduler's job keeps things, as its file spells them: ``ckpt`` and ``metrics`` in the
    run directory, ``files`` the folder the engine's own files (DeepSpeed's JSON) are placed in, and
    the variables the scheduler's file defines for the launch (``var(name)``: ``$NAME`` in a shell
    script, ``$(NAME)`` in a container's command)."""

    ckpt: str
    metrics: str
    files: str
    style: str  # "shell" | "container"

    def var(self, name: str) -> str:
        return f"${name}" if self.style == "shell" else f"$({name})"


@dataclass(frozen=True)
class Launch:
    """What every node runs: ``launcher`` (torchrun, or DeepSpeed's launcher started once per node)
    and ``program`` (the script or module and its arguments); ``files``: the engine's files the
    program reads (name -> text, placed in :attr:`Paths.files`); ``env``: variables the node needs,
    with their defaults (the site may set them); what the launch leaves out, listed."""

    launcher: str
    program: list[str]
    files: dict[str, str]
    env: dict[str, str]
    unexpressed: list[str]


MEGATRON_HOME = "MEGATRON_LM"  # the variable naming the Megatron-LM checkout that holds pretrain_gpt.py
MEGATRON_DEFAULT = "Megatron-LM"
TORCHTITAN_CONFIG = "TORCHTITAN_CONFIG"  # the torchtitan config_registry function of the model


def launch(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions, paths: Paths,
           model_config: dict | None = None) -> Launch:
    """The node launch of ``job.engine`` with the run's data, checkpoint directory and interval and
    step count. dayzero's runtime refuses here, with its own reason, a layout it would refuse when
    the job starts (:func:`dayzero.runtime.checks.check_runtime`, the one place of that rule); an
    engine refuses what its export refuses."""
    steps, every = str(job.steps), str(job.ckpt_every)
    if job.engine == "dayzero":
        from dayzero.runtime.checks import check_runtime

        check_runtime(spec, parallel, parallel.world)
        program = ["-m", *train_args(spec, parallel, job, Ref(paths.ckpt), Ref(paths.metrics))]
        return Launch("torchrun", program, {}, {}, unexpressed(parallel))
    if job.device != "cuda":
        raise ConfigError("--engine", None, f"{job.engine} jobs are written for --device cuda, not {job.device}")
    if job.engine == "megatron":
        from dayzero.export import megatron

        exp = megatron.export(spec, parallel, devices_per_node=job.devices_per_node)
        args = exp.command[exp.command.index("pretrain_gpt.py") + 1:]
        run = ["--save", Ref(paths.ckpt), "--load", Ref(paths.ckpt), "--save-interval", every, "--train-iters", steps,
               "--tokenizer-type", "NullTokenizer"]  # a pre-tokenized corpus: the vocabulary is --vocab-size
        missing = list(exp.unexpressed)
        if job.data:
            run += ["--data-path", job.data]
        else:
            run.append("--mock-data")
            missing.append("a corpus: no --data, so Megatron trains on --mock-data (synthetic tokens)")
        program = [Ref(f"{paths.var(MEGATRON_HOME)}/pretrain_gpt.py"), *args, *run]
        return Launch("torchrun", program, {}, {MEGATRON_HOME: MEGATRON_DEFAULT}, missing)
    if job.engine == "torchtitan":
        from dayzero.export import torchtitan

        exp = torchtitan.export(spec, parallel, devices_per_node=job.devices_per_node, ckpt_every=job.ckpt_every)
        args = exp.command[exp.command.index("torchtitan.train") + 1:]
        args = [Ref(paths.var(TORCHTITAN_CONFIG)) if w == torchtitan.CONFIG_VAR else w for w in args]
        run = ["--checkpoint.folder", Ref(paths.ckpt), "--training.steps", steps]
        missing = list(exp.unexpressed)
        if job.data:
            run += ["--dataloader.dataset_path", job.data]
        else:
            missing.append("a corpus: no --data, so torchtitan reads the registry function's own dataset")
        tail = [w for w in args if w.startswith("activation_checkpoint:")]  # a subcommand: after every flag
        program = ["-m", "torchtitan.train", *[w for w in args if w not in tail], *run, *tail]
        return Launch("torchrun", program, {}, {TORCHTITAN_CONFIG: ""}, missing)
    from dayzero.export import deepspeed

    exp = deepspeed.export(spec, parallel, devices_per_node=job.devices_per_node, model_config=model_config)
    files = {k: v for k, v in exp.files.items() if k != deepspeed.LAUNCH_FILE}
    model = ["--model-config", Ref(f"{paths.files}/{deepspeed.MODEL_FILE}")] if model_config is not None \
        else ["--model", spec.name]
    program = deepspeed.script_args(parallel, model)
    program[program.index(deepspeed.CONFIG_FILE)] = Ref(f"{paths.files}/{deepspeed.CONFIG_FILE}")
    program += ["--save-dir", Ref(paths.ckpt), "--save-interval", every, "--train-iters", steps]
    missing = list(exp.unexpressed)
    if job.data:
        program += ["--data-path", job.data]
    else:
        missing.append("a corpus: no --data given to train.py")
    missing.append("train.py: DeepSpeed runs your script; it must read --model-config, --data-path, --save-dir, "
                   "--save-interval and --train-iters (engine.save_checkpoint / load_checkpoint)")
    return Launch("deepspeed", program, files, {}, missing)


def schedule_of(plan: object) -> dict[str, int]:
    """The step count and the checkpoint interval a ``dayzero plan/predict --json`` file derived
    (its best plan's ``training``: ``steps`` for its tokens, ``failures.optimal_checkpoint_interval_steps``,
    the interval that minimises time lost to interruptions, :mod:`dayzero.planner.training_cost`);
    the keys it does not hold are left out."""
    best = plan.get("plans", [plan])[0] if isinstance(plan, dict) else None
    training = best.get("training") if isinstance(best, dict) else None
    if not isinstance(training, dict):
        return {}
    failures = training.get("failures") if isinstance(training.get("failures"), dict) else {}
    out = {}
    for key, value in (("steps", training.get("steps")),
                       ("ckpt_every", failures.get("optimal_checkpoint_interval_steps"))):
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value < 2**31:
            out[key] = value
    if "steps" in out and "ckpt_every" in out:
        out["ckpt_every"] = min(out["ckpt_every"], out["steps"])
    return out


def unexpressed(parallel: ParallelConfig) -> list[str]:
    """Settings of the plan that ``dayzero train``'s flags do not carry (layout_fields.not_train_flags)."""
    return [f"{f.runtime} ({f.name} {getattr(parallel, f.name)})" for f in not_train_flags()
            if getattr(parallel, f.name) != f.default]
