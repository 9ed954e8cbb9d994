"""torchtitan 0.3: a plan as the command-line overrides torchtitan's ``ConfigManager`` parses, and the reverse.

torchtitan 0.3 has no TOML job file: ``ConfigManager.parse_args`` loads a ``Trainer.Config`` from a
``config_registry`` function (``--module llama3 --config llama3_8b``) and applies ``<section>.<key>``
overrides with tyro (``torchtitan/config/manager.py``). The overrides written here set the sections
that state a layout: ``parallelism`` (dp_shard / dp_replicate, tp + sequence parallel, pp + schedule
+ micro-batch + layers per virtual stage, cp, ep), ``training`` (local/global batch, seq_len),
``checkpoint``, ``compile`` and the ``activation_checkpoint`` subcommand (selective | full | none,
``torchtitan/distributed/activation_checkpoint.py``). FSDP2 is ZeRO-3 by default and ZeRO-2 with
``fsdp_reshard_after_forward never``; DDP (``data_parallel_replicate_degree``) is ZeRO-0 (torchtitan
docs/fsdp.md). Float8 is a model converter inside the registry function (``Float8LinearConverter``,
see ``llama3_debugmodel_float8``), not an override: the export says so, and its header records the
precision (and the layer count interleaving needs) so that an import gives back the same plan.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.export.common import Export, integer_setting, require_engine
from dayzero.export.quoting import comment, shell_line
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

ARGS_FILE = "torchtitan_args.txt"
HEADER = "# dayzero:"  # the facts the overrides cannot carry: `# dayzero: precision=fp8 layers=32`
# torch.distributed.pipelining schedule names torchtitan's pipeline_parallel_schedule takes
SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe",
             "dualpipev": "DualPipeV"}  # torch.distributed.pipelining get_schedule_class names
CONFIG_VAR = "$TORCHTITAN_CONFIG"  # the config_registry function of the model, which the user names
CHECKPOINT_EVERY = 500  # torchtitan's own default checkpoint.interval (components/checkpointer/base.py)


def overrides(parallel: ParallelConfig, layers: int, ckpt_every: int = CHECKPOINT_EVERY) -> list[str]:
    """The ``<section>.<key>`` arguments of ``parallel`` (a model of ``layers`` decoder layers),
    checkpointing every ``ckpt_every`` steps."""
    p = parallel
    shard, replicate = (1, p.dp) if p.zero == 0 else (p.dp, 1)
    a: list = ["--parallelism.data_parallel_shard_degree", shard, "--parallelism.data_parallel_replicate_degree",
               replicate, "--parallelism.tensor_parallel_degree", p.tp, "--parallelism.context_parallel_degree", p.cp,
               "--parallelism.expert_parallel_degree", p.ep, "--parallelism.pipeline_parallel_degree", p.pp]
    if p.zero == 2:
        a += ["--parallelism.fsdp_reshard_after_forward", "never"]
    a.append("--parallelism.enable_sequence_parallel" if p.sequence_parallel else
             "--parallelism.no-enable-sequence-parallel")
    local = p.mbs
    if p.pp > 1:  # the local batch is split into pipeline micro-batches (training.local_batch_size docs)
        local = p.mbs * p.microbatches
        a += ["--parallelism.pipeline_parallel_schedule", SCHEDULES[p.schedule],
              "--parallelism.pipeline_parallel_microbatch_size", p.mbs]
        if p.vpp > 1:
            a += ["--parallelism.pipeline_parallel_layers_per_stage", layers // (p.pp * p.vpp)]
    a += ["--training.local_batch_size", local, "--training.global_batch_size", p.gbs, "--training.seq_len", p.seq,
          "--checkpoint.enable", "--checkpoint.interval", ckpt_every]
    if p.precision == "fp8":  # torchtitan docs/float8.md: float8 runs fast only compiled
        a += ["--compile.enable", "--compile.components", "model,loss"]
    a.append(f"activation_checkpoint:{p.recompute}")  # a tyro subcommand: after every flag
    return [str(x) for x in a]


def export(spec: ModelSpec, parallel: ParallelConfig, nodes: int | None = None, devices_per_node: int = 8,
           ckpt_every: int = CHECKPOINT_EVERY) -> Export:
    require_engine("torchtitan", parallel)
    p = parallel
    module, config, missing = _model(spec)
    if p.precision == "fp8":
        missing.append("fp8: torchtitan 0.3 sets float8 with a Float8LinearConverter in the config_registry "
                       "function (as llama3_debugmodel_float8 does), not with an override")
    if p.etp > 1:
        missing.append(f"etp {p.etp}: torchtitan 0.3 has no expert-tensor-parallel degree (EP borrows ranks from "
                       "FSDP and TP)")
    if p.recompute_layers is not None:
        missing.append(f"recompute of {p.recompute_layers} layers per stage (torchtitan's full AC wraps every block)")
    if p.layer_split:
        missing.append(f"layer split {p.layer_split} (torchtitan splits evenly, less "
                       "pipeline_parallel_first/last_stage_less_layers at the ends)")
    if p.vpp > 1 and spec.layers % (p.pp * p.vpp):
        missing.append(f"{spec.layers} layers are not divisible into pp*vpp = {p.pp * p.vpp} even virtual stages")
    args = overrides(p, spec.layers, ckpt_every)
    nnodes = nodes or max(1, p.world // devices_per_node)
    command = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={p.world // nnodes}", "--rdzv-backend=c10d",
               "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT", "-m", "torchtitan.train",
               "--module", module, "--config", config, *args]
    header = comment(f"{HEADER[2:]} precision={p.precision} layers={spec.layers} model={spec.name}", "the model name")
    header += "\n"
    lines = [shell_line(pair, "a torchtitan override") for pair in _pairs(args)]
    return Export("torchtitan", {ARGS_FILE: header + "\n".join(lines) + "\n"}, command, missing)


def _model(spec: ModelSpec) -> tuple[str, str, list[str]]:
    """(module, config, notes): torchtitan's registered config whose model equals ``spec``
    (export/torchtitan_models.py: built by torchtitan on the meta device; a model none equals is
    refused there); without torchtitan installed, the model's module and ``$TORCHTITAN_CONFIG``
    for the user to set, said in a note."""
    import importlib.util

    from dayzero.export.torchtitan_models import MODULES as TT_MODULES
    from dayzero.export.torchtitan_models import model_config

    module = TT_MODULES.get(spec.model_type)
    if importlib.util.find_spec("torchtitan") is None or importlib.util.find_spec("torch") is None:
        return module or spec.model_type, CONFIG_VAR, [
            f"the model: torchtitan is not installed here, so the config_registry function whose model equals "
            f"{spec.name} was not looked up; set $TORCHTITAN_CONFIG (pip install 'dayzero[engines]' finds it)"]
    r = model_config(spec)
    return r.module, r.config, []


def _pairs(args: list[str]) -> list[list[str]]:
    out: list[list[str]] = []
    for w in args:
        if w.startswith("--") or ":" in w or not out:
            out.append([w])
        else:
            out[-1].append(w)
    return out


def _header(text: str) -> dict[str, str]:
    for line in text.splitlines():
        if line.startswith(HEADER):
            return dict(kv.split("=", 1) for kv in line[len(HEADER):].split() if "=" in kv)
    return {}


def parallel_from_args(argv: list[str], world: int, header: dict[str, str] | None = None
                       ) -> tuple[ParallelConfig, list[str]]:
    """torchtitan overrides on ``world`` ranks -> (ParallelConfig, notes on what was assumed or not read)."""
    header, notes, vals, recompute = header or {}, [], {}, "selective"  # torchtitan's registries default to SAC
    flags = {"enable_sequence_parallel": True, "checkpoint.enable": False, "compile.enable": False}
    i = 0
    while i < len(argv):
        w = argv[i]
        key = w[2:].replace("-", "_") if w.startswith("--") else None
        if w.startswith("activation_checkpoint:") or w.startswith("activation-checkpoint:"):
            recompute = w.split(":", 1)[1]
            if recompute not in ("none", "selective", "full"):
                raise ConfigError("torchtitan overrides", "activation_checkpoint", f"{recompute!r} has no dayzero "
                                  "equivalent (none, selective, full)")
        elif key in ("parallelism.enable_sequence_parallel", "checkpoint.enable", "compile.enable"):
            flags[key.removeprefix("parallelism.")] = True
        elif key in ("parallelism.no_enable_sequence_parallel", "checkpoint.no_enable", "compile.no_enable"):
            flags[key.replace("no_", "", 1).removeprefix("parallelism.")] = False
        elif key is not None and i + 1 < len(argv):
            vals[key] = argv[i + 1]
            i += 1
        elif key is not None:
            raise ConfigError("torchtitan overrides", w, "has no value")
        i += 1

    def num(key: str, default: int, unset: int | None = None) -> int:
        """An integer override: positive and below 2^31, or ``unset`` (torchtitan's "not given": -1 or 0)."""
        v = vals.pop(key, None)
        return default if v is None else integer_setting("torchtitan overrides", f"--{key}", v, unset=unset)

    par = "parallelism."
    tp, cp, pp, ep = (num(par + k, 1) for k in ("tensor_parallel_degree", "context_parallel_degree",
                                                  "pipeline_parallel_degree", "expert_parallel_degree"))
    replicate = num(par + "data_parallel_replicate_degree", 1)
    shard = num(par + "data_parallel_shard_degree", -1, unset=-1)
    if world % (tp * cp * pp * replicate):
        raise ConfigError("torchtitan overrides", None, f"{world} ranks are not divisible by tp*cp*pp*dp_replicate "
                          f"= {tp * cp * pp * replicate}")
    if shard == -1:  # torchtitan: the leftover ranks
        shard = world // (tp * cp * pp * replicate)
    dp = replicate * shard
    if dp * tp * cp * pp != world:
        raise ConfigError("torchtitan overrides", None, f"the degrees cover {dp * tp * cp * pp} ranks, not {world}")
    reshard = vals.pop(par + "fsdp_reshard_after_forward", "default")
    zero = 0 if shard == 1 else 2 if reshard == "never" else 3
    if replicate > 1 and shard > 1:
        notes.append(f"HSDP (dp_replicate {replicate} x dp_shard {shard}): read as ZeRO-{zero} over dp {dp}")
    local = num("training.local_batch_size", 8)  # torchtitan's TrainingConfig defaults
    mbs = num(par + "pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    gbs = num("training.global_batch_size", -1, unset=-1)
    gbs = local * dp if gbs == -1 else gbs
    schedule = {v: k for k, v in SCHEDULES.items()}.get(vals.pop(par + "pipeline_parallel_schedule", "1F1B"))
    if schedule is None:
        raise ConfigError("torchtitan overrides", "--parallelism.pipeline_parallel_schedule", "has no dayzero "
                          f"equivalent ({', '.join(SCHEDULES.values())})")
    vpp = 1
    per_stage = num(par + "pipeline_parallel_layers_per_stage", 0, unset=0)
    if schedule == "interleaved":
        try:
            layers = max(0, int(header.get("layers", 0)))
        except ValueError:
            raise ConfigError("torchtitan overrides", "# dayzero: layers", f"{header.get('layers')!r} is not an "
                              "integer") from None
        if per_stage and layers:
            vpp = layers // (pp * per_stage)
        else:
            vpp = 2
            notes.append("interleaved schedule without layers per stage and layer count: vpp 2 assumed")
    precision = header.get("precision", "bf16")
    if precision not in ("bf16", "fp8"):
        raise ConfigError("torchtitan overrides", "precision", f"{precision!r}: torchtitan trains bf16 or fp8")
    p = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, mbs=mbs, gbs=gbs,
                       seq=num("training.seq_len", 2048), zero=zero, recompute=recompute,
                       sequence_parallel=flags["enable_sequence_parallel"] and tp > 1, precision=precision,
                       schedule=schedule)
    known = {"checkpoint.interval", "checkpoint.folder", "compile.components"}
    notes += [f"--{k}: not a layout setting, not read" for k in vals if k not in known]
    return p, notes


def import_file(path: str | Path, world: int) -> tuple[ParallelConfig, list[str]]:
    """A file of torchtitan overrides (``torchtitan_args.txt``, or a whole ``torchrun ... torchtitan.train``
    launch line) on ``world`` ranks."""
    from dayzero.inputs import read_text

    text = read_text(path, "torchtitan overrides (--parallelism.* ...)")
    argv = shlex.split(text, comments=True)
    if "torchtitan.train" in argv:
        argv = argv[argv.index("torchtitan.train") + 1:]
    notes = []
    for flag in ("--module", "--config"):
        if flag in argv:
            j = argv.index(flag)
            del argv[j:j + 2]
    header = _header(text)
    if not header:
        notes.append("no '# dayzero:' header: precision bf16 assumed (torchtitan sets float8 in the registry)")
    parallel, more = parallel_from_args(argv, world, header)
    return parallel, notes + more
