"""A one-node Slurm cluster on this machine, for tests: munged, slurmctld and slurmd on 127.0.0.1
with a temporary ``slurm.conf`` (Debian's ``slurm-wlm`` and ``munge`` packages).

No accounting daemon (slurmdbd): ``JobRequeue=1`` lets a batch job requeue itself with ``scontrol
requeue`` (what the exported script does after a failed step), which slurmctld alone handles. The
daemons run as the current user (root in the CI container: ``SlurmUser=root``), in the foreground
(``-D``) as this process's children, so stopping them is a kill of their pids. Clients find the
cluster through ``SLURM_CONF`` (:meth:`SlurmCluster.env`).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
NODE = "localhost"
# A requeued job waits the credential lifetime before it may start again (slurm.conf, AuthInfo cred_expire: "also
# controls how long a requeued job must wait before starting again", default 120 s); short here, so a requeue test
# waits seconds, not minutes.
CRED_EXPIRE_S = 10


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _real_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 * 9 // 10  # slurmd refuses a node claiming more than it has
    return 1024


def slurm_conf(root: Path, cpus: int, memory_mb: int, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    """The cluster's slurm.conf (option names: https://slurm.schedmd.com/slurm.conf.html)."""
    user = getpass.getuser()
    lines = {
        "ClusterName": "dayzero-test", "SlurmctldHost": "localhost(127.0.0.1)", "SlurmUser": user,
        "SlurmdUser": user, "SlurmctldPort": ctld_port, "SlurmdPort": slurmd_port,
        "AuthType": "auth/munge", "CredType": "cred/munge",
        "AuthInfo": f"socket={munge_socket},cred_expire={CRED_EXPIRE_S}",
        "StateSaveLocation": root / "state", "SlurmdSpoolDir": root / "spool",
        "SlurmctldPidFile": root / "slurmctld.pid", "SlurmdPidFile": root / "slurmd.pid",
        "SlurmctldLogFile": root / "slurmctld.log", "SlurmdLogFile": root / "slurmd.log",
        "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none", "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core", "MpiDefault": "none", "SwitchType": "switch/none",
        "JobAcctGatherType": "jobacct_gather/none", "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/none", "ReturnToService": 2, "JobRequeue": 1, "SchedulerType": "sched/backfill",
        "SchedulerParameters": "sched_interval=2,bf_interval=2",  # start a requeued job as soon as it may
        "MinJobAge": 600, "KillWait": 5, "InactiveLimit": 0, "SlurmctldTimeout": 30, "SlurmdTimeout": 60,
        "SlurmctldDebug": "info", "SlurmdDebug": "info",
    }
    text = "".join(f"{k}={v}\n" for k, v in lines.items())
    text += f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN\n"
    text += f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO\n"
    return text


@dataclass
class SlurmCluster:
    root: Path
    cpus: int = 2
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        r = subprocess.run([_which(argv[0]), *argv[1:]], env=self.env(), capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}\n{self.logs()}")
        return r.stdout

    def logs(self) -> str:
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            p = self.root / name
            if p.exists():
                out.append(f"--- {name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)

    def start(self, timeout: float = 60) -> "SlurmCluster":
        for d in ("state", "spool", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = self.root / "munge" / "munge.socket"
        self.conf.write_text(slurm_conf(self.root, self.cpus, _real_memory_mb(), _free_port(), _free_port(), sock))
        self._spawn("munged", "-F", "-f", f"--key-file={key}", f"--socket={sock}",
                    f"--pid-file={self.root / 'munge' / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}",
                    f"--seed-file={self.root / 'munge' / 'munged.seed'}")
        self._wait(lambda: sock.exists(), timeout, "munged's socket")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-N", NODE, "-f", str(self.conf))
        self._wait(self._idle, timeout, f"node {NODE} idle in sinfo")
        return self

    def _spawn(self, *argv: str) -> None:
        log = (self.root / f"{argv[0]}.out").open("w")
        self.procs.append(subprocess.Popen([_which(argv[0]), *argv[1:]], env=self.env(), stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def _idle(self) -> bool:
        dead = [p.args[0] for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited while starting\n{self.logs()}")
        r = subprocess.run([_which("sinfo"), "-h", "-N", "-o", "%t"], env=self.env(), capture_output=True, text=True)
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def _wait(self, ready, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}\n{self.logs()}")

    def job_state(self, job: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED, FAILED, ...), from scontrol (no accounting)."""
        out = self.run("scontrol", "-o", "show", "job", job, check=False)
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def job_field(self, job: str, name: str) -> str | None:
        out = self.run("scontrol", "-o", "show", "job", job, check=False)
        for word in out.split():
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
        return None

    def wait_job(self, job: str, timeout: float, until=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                         "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.job_state(job)
            if state in until:
                return state
            time.sleep(1)
        raise TimeoutError(f"job {job} still {self.job_state(job)} after {timeout:.0f} s\n{self.logs()}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()


def sbatch_parse_error(script: Path, root: Path) -> str | None:
    """Slurm's own verdict on a script's ``#SBATCH`` options, with no cluster: sbatch parses and
    checks every option (and a --gres against ``GresTypes``) before it contacts the controller, so
    with a config naming a controller that is not there, "Unable to contact slurm controller" means
    it accepted them. None when accepted, else sbatch's message."""
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "client.conf"
    closed = _free_port()  # nothing listens there: the submission fails at once, after the parse
    conf.write_text(slurm_conf(root, 2, 1024, closed, closed, root / "no-munge.socket")
                    + "GresTypes=gpu,npu\nMessageTimeout=1\n")
    r = subprocess.run([_which("sbatch"), str(script)], env={**os.environ, "SLURM_CONF": str(conf)},
                       capture_output=True, text=True, timeout=60)
    if r.returncode and "Unable to contact slurm controller" in r.stderr:
        return None
    return r.stderr.strip() or f"sbatch exited {r.returncode}"
