"""The option groups of ``dayzero export`` (:mod:`dayzero.cli.option_groups`): the scheduler's flags
(``--to slurm | kubernetes``) and the Megatron memory switches, as declared on the verb."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer


@dataclass(frozen=True)
class SchedulerOptions:
    """--device ... --volume-claim: what a Slurm or Kubernetes job runs, where and how long
    (dayzero.export.job.JobOptions)."""

    device: Annotated[Optional[str], typer.Option("--device", help="Scheduler: the ranks' device, cuda | npu | cpu "
                                                                   "(default cuda).")] = None
    job_name: Annotated[Optional[str], typer.Option("--job-name", help="Scheduler: the job's name (Kubernetes: also "
                                                                       "its namespace; default dayzero).")] = None
    run_dir: Annotated[Optional[str], typer.Option("--run-dir", help="Scheduler: the run directory on the shared file "
                                                                     "system: ckpt/, metrics.jsonl, logs (default "
                                                                     "runs/dayzero).")] = None
    engine: Annotated[Optional[str], typer.Option("--engine", help="Scheduler: what every node launches, dayzero | "
                                                                   "megatron | torchtitan | deepspeed (default "
                                                                   "dayzero, its runtime).")] = None
    data: Annotated[Optional[str], typer.Option("--data", help="Scheduler: the training corpus on the shared file "
                                                               "system (dayzero train --data, Megatron --data-path, "
                                                               "torchtitan dataset_path, train.py "
                                                               "--data-path).")] = None
    rank_table: Annotated[Optional[str], typer.Option("--rank-table", help="Scheduler with --device npu, or --to "
                                                                           "mindspeed: the HCCL rank "
                                                                           "table (JSON) on every node, for "
                                                                           "RANK_TABLE_FILE (default: torchrun's "
                                                                           "rendezvous).")] = None
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Scheduler: optimizer steps (default: the "
                                                                        "plan file's steps for its tokens, else "
                                                                        "100).")] = None
    ckpt_every: Annotated[Optional[int], typer.Option("--ckpt-every", min=1, help="Scheduler: checkpoint every N "
                                                      "steps (default: the plan file's optimal interval, else "
                                                      "50).")] = None
    max_requeues: Annotated[Optional[int], typer.Option("--max-requeues", min=0, help="Scheduler: requeues (Slurm) "
                                                        "or restarts (Kubernetes) after a failure (default "
                                                        "3).")] = None
    partition: Annotated[Optional[str], typer.Option("--partition", help="Slurm partition.")] = None
    time_limit: Annotated[Optional[str], typer.Option("--time", help="Scheduler: time limit, Slurm's format "
                                                                     "(minutes, HH:MM:SS, D-HH:MM:SS).")] = None
    exclude_from: Annotated[Optional[Path], typer.Option("--exclude-from", help="Scheduler: keep off the hosts of this "
                                                         "file (a run's exclusions.json, JSON {\"hosts\": [...]}, a "
                                                         "JSON list, or one per line).")] = None
    exclude: Annotated[Optional[str], typer.Option("--exclude", help="Scheduler: hosts to keep off, "
                                                                     "comma-separated.")] = None
    cpus_per_node: Annotated[Optional[int], typer.Option("--cpus-per-node", min=1, help="Scheduler: cores per node "
                                                         "(default: Slurm the whole node, Kubernetes 4 per "
                                                         "device).")] = None
    mem_per_node: Annotated[Optional[int], typer.Option("--mem-per-node", min=1, help="Scheduler: GiB of memory per "
                                                        "node (default: Slurm the whole node, Kubernetes 32 per "
                                                        "device).")] = None
    image: Annotated[Optional[str], typer.Option("--image", help="Kubernetes: the container image with dayzero "
                                                                 "installed.")] = None
    volume_claim: Annotated[Optional[str], typer.Option("--volume-claim", help="Kubernetes: the ReadWriteMany "
                                                        "PersistentVolumeClaim holding --run-dir (default "
                                                        "JOB-NAME-run).")] = None

    def given(self) -> dict:
        """{flag: value} of every scheduler flag (None: not given)."""
        return {"--device": self.device, "--job-name": self.job_name, "--run-dir": self.run_dir, "--steps": self.steps,
                "--ckpt-every": self.ckpt_every, "--max-requeues": self.max_requeues, "--partition": self.partition,
                "--time": self.time_limit, "--exclude-from": self.exclude_from, "--exclude": self.exclude,
                "--cpus-per-node": self.cpus_per_node, "--mem-per-node": self.mem_per_node, "--image": self.image,
                "--volume-claim": self.volume_claim, "--rank-table": self.rank_table, "--engine": self.engine,
                "--data": self.data}

    def job(self, schedule: dict, model: str, devices_per_node: int | None):
        """(the job's JobOptions, what was assumed): steps and checkpoint interval as given, else the plan
        file's (``schedule``: dayzero.export.job.schedule_of), else dayzero's defaults, said as assumed;
        the hosts kept off are --exclude-from's then --exclude's, each once."""
        from dayzero.export.job import JobOptions, hosts_to_exclude

        hosts = (hosts_to_exclude(self.exclude_from) if self.exclude_from else ()) + tuple(
            h.strip() for h in (self.exclude or "").split(",") if h.strip())
        steps = self.steps or schedule.get("steps")
        ckpt_every = self.ckpt_every or schedule.get("ckpt_every")
        defaults = []
        if steps is None or ckpt_every is None:
            defaults.append(f"{'steps' if steps is None else 'checkpoint interval'} from dayzero's defaults "
                            f"({'--steps 100' if steps is None else '--ckpt-every 50'}), not a plan's: export a "
                            "`dayzero plan --tokens N --json` file, or give --steps and --ckpt-every")
        job = JobOptions(**{k: v for k, v in dict(
            name=self.job_name, devices_per_node=devices_per_node, device=self.device, run_dir=self.run_dir,
            steps=steps, ckpt_every=ckpt_every, max_requeues=self.max_requeues, partition=self.partition,
            time_limit=self.time_limit, exclude=tuple(dict.fromkeys(hosts)), memory_gb=self.mem_per_node,
            cpus_per_node=self.cpus_per_node, image=self.image, volume_claim=self.volume_claim,
            rank_table=self.rank_table, engine=self.engine, data=self.data, model=model).items()
            if v not in (None, ())})
        return job, defaults


@dataclass(frozen=True)
class MemorySwitches:
    """--fp8-param-gather, --optimizer-offload, --activation-offload: the memory switches a plan was
    made with, written by the engines that run them."""

    fp8_params: Annotated[bool, typer.Option("--fp8-param-gather", help="Megatron: FP8 parameter storage and "
                                             "all-gathers under --precision fp8 (as planned with the same "
                                             "flag).")] = False
    optimizer_offload: Annotated[bool, typer.Option("--optimizer-offload", help="Megatron: the optimizer on the "
                                                    "host (--optimizer-cpu-offload, as planned with the same "
                                                    "flag).")] = False
    activation_offload: Annotated[int, typer.Option("--activation-offload", metavar="N", min=0,
                                                    help="Megatron: the saved activations of the first N layers on "
                                                         "the host (--cpu-offloading --cpu-offloading-num-layers N, "
                                                         "as planned with the same flag).")] = 0

    def refuse_unwritten(self, to: str) -> None:
        """A one-line ConfigError for a switch the target ``to`` does not write."""
        from dayzero.errors import ConfigError

        for flag, on, writers in (("--fp8-param-gather", self.fp8_params, ("megatron",)),
                                  ("--optimizer-offload", self.optimizer_offload, ("megatron", "mindspeed")),
                                  ("--activation-offload", self.activation_offload, ("megatron",))):
            if on and to not in writers:
                raise ConfigError(flag, None, f"only --to {' or '.join(writers)} writes it, not {to}")
