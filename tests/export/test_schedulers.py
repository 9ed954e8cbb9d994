"""dayzero export --to slurm | kubernetes: for five plans the sbatch script uses only sbatch's own
options and is valid bash, the Kubernetes manifests are accepted by the `kubernetes` client's models
and the PyTorchJob uses only the training operator's fields, and every rank runs a `dayzero train`
command that dayzero's own CLI parses. What a scheduler cannot lay out is one line, exit 2."""

import json
import re
import shlex
import shutil
import subprocess

import pytest
import typer.main
import yaml

from dayzero.cli.app import app, main
from dayzero.errors import DayzeroError
from dayzero.export import kubernetes, slurm
from dayzero.export.job import JobOptions, expand_hosts, hosts_to_exclude, time_limit_seconds
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model
from helpers.slurm_cluster import sbatch_parse_error

PLANS = [
    ("llama-3.1-8b", P(tp=8, pp=2, dp=4, gbs=64, sequence_parallel=True)),  # dense, two nodes per pipeline
    ("mixtral-8x7b", P(tp=2, pp=1, dp=8, ep=8, gbs=32)),  # MoE with EP
    ("llama-3.1-8b", P(tp=1, pp=4, dp=2, vpp=2, gbs=32, recompute="full")),  # interleaved PP
    ("llama-3.1-8b", P(dp=16, zero=3, gbs=32, mbs=2)),  # ZeRO-3
    ("deepseek-v3", P(tp=1, pp=1, dp=16, ep=4, gbs=64, recompute="selective")),  # MLA + MoE, selective
]
IDS = [f"{m}-{p.describe()}" for m, p in PLANS]

# The PyTorchJob (kubeflow.org/v1) fields the training operator's CRD defines; it has no Python client model.
# https://github.com/kubeflow/training-operator/blob/master/docs/api/kubeflow.org_v1_generated.asciidoc
# (PyTorchJobSpec, RunPolicy, ElasticPolicy, ReplicaSpec) and
# https://www.kubeflow.org/docs/components/training/user-guides/pytorch/
PYTORCHJOB_SPEC = {"runPolicy", "elasticPolicy", "pytorchReplicaSpecs", "nprocPerNode"}
RUN_POLICY = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit", "schedulingPolicy",
              "suspend", "managedBy"}
ELASTIC_POLICY = {"minReplicas", "maxReplicas", "rdzvBackend", "rdzvPort", "rdzvHost", "rdzvId", "rdzvConf",
                  "standalone", "nProcPerNode", "maxRestarts", "metrics"}
REPLICA_SPEC = {"replicas", "template", "restartPolicy"}


def _train_parses(argv: list[str]) -> None:
    """`dayzero train ARGS` as the ranks run it goes through dayzero's own option parser."""
    assert argv[:2] == ["dayzero", "train"]
    cmd = typer.main.get_command(app).commands["train"]
    ctx = cmd.make_context("train", list(argv[2:]))
    assert ctx.params["resume"] == "auto" and ctx.params["ckpt_dir"] is not None


def _job(**kw) -> JobOptions:
    return JobOptions(**{"name": "dz-job", "image": "registry.example/dayzero:1", **kw})


@pytest.mark.parametrize("model, p", PLANS, ids=IDS)
def test_the_sbatch_script_uses_sbatchs_options_and_runs_dayzero_train(model, p, tmp_path):
    job = _job(exclude=("bad1", "bad2"), partition="gpu", time_limit="1-00:00:00")
    exp = slurm.export(load_model(model), p, job=job)
    text = exp.files[slurm.SCRIPT_FILE]
    opts = dict(re.findall(r"^#SBATCH (--[a-z-]+)=?(.*)$", text, re.M))
    nodes = p.world // min(p.world, 8)
    assert opts["--nodes"] == str(nodes) and opts["--gpus-per-node"] == str(min(p.world, 8))
    assert opts["--exclude"] == "bad1,bad2" and "--requeue" in opts and "--exclusive" in opts
    assert opts["--signal"].startswith("B:USR1@")
    assert "NCCL_DEBUG" in text and "scontrol requeue" in text and "--rdzv-backend=c10d" in text
    script = tmp_path / slurm.SCRIPT_FILE
    script.write_text(text)
    if shutil.which("sbatch"):  # the installed sbatch parses and accepts every directive
        assert sbatch_parse_error(script, tmp_path / "slurm") is None
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    line = next(w for w in text.splitlines() if w.strip().startswith("torchrun "))
    words = shlex.split(line.rstrip("&"))
    assert f"--nproc-per-node={min(p.world, 8)}" in words
    _train_parses(words[words.index("-m") + 1:])
    assert exp.unexpressed == []


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch not installed (apt-get install slurm-wlm)")
def test_sbatchs_parse_check_can_fail(tmp_path):
    text = slurm.export(load_model("tiny-llama"), P(dp=2), job=_job()).files[slurm.SCRIPT_FILE]
    script = tmp_path / "bad.sbatch"
    for good, bad in (("--nodes=1", "--nodes=one"), ("--signal=B:USR1", "--singal=B:USR1"),
                      ("--gpus-per-node=2", "--gres=tpu:2")):
        assert good in text
        script.write_text(text.replace(good, bad))
        assert sbatch_parse_error(script, tmp_path / "slurm") is not None, bad


@pytest.mark.parametrize("model, p", PLANS, ids=IDS)
def test_the_kubernetes_manifests_are_valid_client_models(model, p):
    client = pytest.importorskip("kubernetes.client")
    api = client.ApiClient()
    exp = kubernetes.export(load_model(model), p, job=_job(exclude=("bad1",), time_limit="2:00:00"))
    ns, quota, pj = yaml.safe_load_all(exp.files[kubernetes.MANIFEST_FILE])

    def model_of(obj, kind):  # the client's model accepts it and drops nothing (an unknown field would vanish)
        m = api.deserialize(json.dumps(obj), kind, "application/json")
        assert api.sanitize_for_serialization(m) == obj
        return m

    assert model_of(ns, "V1Namespace").metadata.name == "dz-job"
    hard = model_of(quota, "V1ResourceQuota").spec.hard
    assert hard["requests.nvidia.com/gpu"] == str(p.world) and hard["pods"] == str(p.world // min(p.world, 8))
    assert pj["apiVersion"] == "kubeflow.org/v1" and pj["kind"] == "PyTorchJob"
    spec = pj["spec"]
    assert set(spec) <= PYTORCHJOB_SPEC and set(spec["runPolicy"]) <= RUN_POLICY
    assert set(spec["elasticPolicy"]) <= ELASTIC_POLICY and spec["elasticPolicy"]["rdzvBackend"] == "c10d"
    assert set(spec["pytorchReplicaSpecs"]) == {"Worker"}
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert set(worker) <= REPLICA_SPEC and worker["restartPolicy"] == "OnFailure"
    nodes = p.world // min(p.world, 8)
    assert worker["replicas"] == spec["elasticPolicy"]["minReplicas"] == spec["elasticPolicy"]["maxReplicas"] == nodes
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 7200
    pod = model_of(worker["template"], "V1PodTemplateSpec").spec
    c = pod.containers[0]
    assert c.name == "pytorch" and c.resources.limits["nvidia.com/gpu"] == str(min(p.world, 8))
    assert c.resources.requests == c.resources.limits
    shm = next(v for v in pod.volumes if v.name == "dshm")
    assert shm.empty_dir.medium == "Memory"
    anti = pod.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution[0]
    assert anti.topology_key == "kubernetes.io/hostname"
    term = pod.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[0]
    assert term.match_expressions[0].operator == "NotIn" and term.match_expressions[0].values == ["bad1"]
    _train_parses(c.command[c.command.index("-m") + 1:])


def test_npu_and_cpu_ranks_ask_for_their_devices():
    spec, p = load_model("llama-3.1-8b"), P(tp=2, dp=8, gbs=16)
    k = yaml.safe_load_all(kubernetes.export(spec, p, job=_job(device="npu")).files[kubernetes.MANIFEST_FILE])
    pj = list(k)[2]
    c = pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["huawei.com/Ascend910"] == "8"
    assert {"name": "HCCL_CONNECT_TIMEOUT", "value": "1200"} in c["env"] and "--device" in c["command"]
    text = slurm.export(spec, p, job=_job(device="npu")).files[slurm.SCRIPT_FILE]
    assert "#SBATCH --gres=npu:8" in text and "HCCL_CONNECT_TIMEOUT" in text
    text = slurm.export(load_model("tiny-llama"), P(dp=2), job=_job(device="cpu", devices_per_node=2)).files[
        slurm.SCRIPT_FILE]
    assert "#SBATCH --cpus-per-task=2" in text and "--gpus" not in text and "--backend gloo" in text


def test_npu_launch_facts():
    """Ascend nodes: the CANN toolkit's environment sourced where it exists, ASCEND_RT_VISIBLE_DEVICES
    set to the node's cards unless the site set it, HCCL's connect timeout raised, and an HCCL rank
    table passed as RANK_TABLE_FILE when given (Kubernetes too); torchrun's rendezvous otherwise."""
    spec, p = load_model("llama-3.1-8b"), P(tp=2, dp=4, gbs=8)
    text = slurm.export(spec, p, job=_job(device="npu", devices_per_node=4)).files[slurm.SCRIPT_FILE]
    assert 'export ASCEND_RT_VISIBLE_DEVICES="${ASCEND_RT_VISIBLE_DEVICES:-0,1,2,3}"' in text
    assert "CANN_SET_ENV=${CANN_SET_ENV:-/usr/local/Ascend/ascend-toolkit/set_env.sh}" in text
    assert "RANK_TABLE_FILE" not in text and "--rdzv-backend=c10d" in text
    text = slurm.export(spec, p, job=_job(device="npu", rank_table="/etc/hccl/rank table.json")).files[
        slurm.SCRIPT_FILE]
    assert "export RANK_TABLE_FILE='/etc/hccl/rank table.json'" in text
    k = list(yaml.safe_load_all(kubernetes.export(spec, p, job=_job(device="npu", rank_table="/r.json"))
                                .files[kubernetes.MANIFEST_FILE]))[2]
    env = k["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "RANK_TABLE_FILE", "value": "/r.json"} in env
    for device in ("cuda", "cpu"):  # nothing of Ascend's on the others
        text = slurm.export(spec, p, job=_job(device=device, devices_per_node=2)).files[slurm.SCRIPT_FILE]
        assert "ASCEND" not in text and "CANN" not in text
    with pytest.raises(DayzeroError, match="--rank-table: an HCCL rank table is for --device npu"):
        JobOptions(device="cuda", rank_table="/r.json")


@pytest.mark.slow
def test_npu_node_setup_runs(tmp_path):
    """The npu script's set-up lines, run by bash: the toolkit script is sourced when present (and
    its absence is a note, not a failure); the site's ASCEND_RT_VISIBLE_DEVICES wins."""
    lines = slurm.node_setup_lines(_job(device="npu", devices_per_node=4), 4)
    env_sh = tmp_path / "set_env.sh"
    env_sh.write_text("export FAKE_CANN_LOADED=yes\n")
    probe = "\n".join(["set -euo pipefail", *lines, 'echo "$ASCEND_RT_VISIBLE_DEVICES ${FAKE_CANN_LOADED:-no}"'])

    def run(**env):
        r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", **env})
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]

    assert run(CANN_SET_ENV=str(env_sh)) == "0,1,2,3 yes"
    assert run(CANN_SET_ENV=str(tmp_path / "none.sh"), ASCEND_RT_VISIBLE_DEVICES="4,5") == "4,5 no"


def test_what_a_scheduler_cannot_express_is_listed():
    spec = load_model("llama-3.1-8b")
    p = P(tp=2, pp=2, dp=2, gbs=8, recompute="full", recompute_layers=2)
    s = slurm.export(spec, p, job=_job())
    # dayzero train recomputes the first N layers of each chunk (runtime.models.recompute): carried, not listed
    assert "--recompute-layers 2" in s.files[slurm.SCRIPT_FILE]
    assert not any("recompute" in u for u in s.unexpressed)
    k = kubernetes.export(spec, p, job=_job(partition="gpu"))
    assert any("partition gpu" in u for u in k.unexpressed) and any("exclusive" in u for u in k.unexpressed)


def test_exclusion_lists(tmp_path):
    (tmp_path / "exclusions.json").write_text(json.dumps({"hosts": ["gpu-07", "gpu-11", "gpu-07"], "why": {}}))
    (tmp_path / "list.json").write_text('["a1", "a2"]')
    (tmp_path / "hosts.txt").write_text("# drained\nnode[1-3]\n\nnode9  # flaky NIC\n")
    assert hosts_to_exclude(tmp_path / "exclusions.json") == ("gpu-07", "gpu-11")
    assert hosts_to_exclude(tmp_path / "list.json") == ("a1", "a2")
    assert hosts_to_exclude(tmp_path / "hosts.txt") == ("node[1-3]", "node9")
    assert expand_hosts(("gpu[01-03,07]", "node9", "n[9-10]b")) == ["gpu01", "gpu02", "gpu03", "gpu07", "node9",
                                                                   "n9b", "n10b"]
    k = kubernetes.export(load_model("tiny-llama"), P(dp=2), job=_job(exclude=("node[1-2]",)))
    pod = list(yaml.safe_load_all(k.files[kubernetes.MANIFEST_FILE]))[2]["spec"]["pytorchReplicaSpecs"]["Worker"]
    term = pod["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["node1", "node2"]


def test_the_runs_own_exclusion_file_is_read_as_hosts(tmp_path):
    """The file the trainer's alert actions write (dayzero.specs.exclusions) feeds --exclude-from:
    a host with any excluded device slot is kept off whole (Slurm allocates nodes exclusively)."""
    from dayzero.specs.exclusions import Exclusion, add_exclusions

    f = tmp_path / "exclusions.json"
    add_exclusions(f, [Exclusion(rank=3, slot=3, host="gpu-02", reason="straggler", step=7, time="t"),
                       Exclusion(rank=9, slot=1, host="gpu-01", reason="hang", step=None, time="t"),
                       Exclusion(rank=2, slot=2, host="gpu-02", reason="straggler", step=9, time="t")])
    assert hosts_to_exclude(f) == ("gpu-01", "gpu-02")
    f.write_text(json.dumps({"format": "dayzero-exclusions/1", "excluded": [{"host": 1}]}))
    with pytest.raises(DayzeroError, match="exclusion list"):
        hosts_to_exclude(f)


def test_slurm_time_limits():
    assert [time_limit_seconds(t) for t in ("30", "1:30", "2:00:00", "1-2", "1-2:30", "1-0:0:5")] == [
        1800, 90, 7200, 93600, 95400, 86405]


def test_cli_slurm_export_with_an_exclusion_file(tmp_path, capsys):
    excl = tmp_path / "exclusions.json"
    excl.write_text(json.dumps({"hosts": ["gpu-07"]}))
    out = tmp_path / "job"
    assert main(["export", "llama-3.1-8b", "--to", "slurm", "--devices", "16", "--tp", "2", "--pp", "2", "--gbs", "8",
                 "--exclude-from", str(excl), "--exclude", "gpu-09", "--run-dir", "/shared/run1", "--steps", "500",
                 "-o", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    text = (out / slurm.SCRIPT_FILE).read_text()
    assert got["command"] == ["sbatch", slurm.SCRIPT_FILE] and got["written"] == [str(out / slurm.SCRIPT_FILE)]
    assert "#SBATCH --exclude=gpu-07,gpu-09" in text and "RUN_DIR=/shared/run1" in text and "--steps 500" in text


def test_cli_kubernetes_export(tmp_path, capsys):
    assert main(["export", "mixtral-8x7b", "--to", "kubernetes", "--devices", "16", "--tp", "2", "--ep", "8",
                 "--image", "reg/dz:1", "--job-name", "mixtral-a", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    docs = list(yaml.safe_load_all(got["files"][kubernetes.MANIFEST_FILE]))
    assert [d["kind"] for d in docs] == ["Namespace", "ResourceQuota", "PyTorchJob"]
    assert docs[2]["metadata"]["namespace"] == "mixtral-a"


@pytest.mark.parametrize("argv, says", [
    (["--to", "slurm", "--devices", "12"], "every node runs the same number of ranks"),
    (["--to", "kubernetes", "--devices", "16", "--tp", "8", "--devices-per-node", "4", "--image", "x"],
     "cannot keep a tp 8 group inside a node of 4"),
    (["--to", "slurm", "--devices", "8", "--exclude-from", "{missing}"], "file not found"),
    (["--to", "slurm", "--devices", "8", "--exclude-from", "{badhosts}"], "not a hostname"),
    (["--to", "kubernetes", "--devices", "8"], "--image"),
    (["--to", "kubernetes", "--devices", "8", "--image", "x", "--job-name", "Big_Job"], "lowercase"),
    (["--to", "slurm", "--devices", "8", "--time", "soon"], "--time"),
    (["--to", "slurm", "--devices", "8", "--exclude", "ok,rm -rf"], "not a hostname"),
    (["--to", "slurm", "--devices", "8", "--device", "tpu"], "--device"),
    (["--to", "megatron", "--devices", "8", "--partition", "gpu"], "is a scheduler option"),
    (["--to", "slurm", "--devices", "8", "--rank-table", "/r.json"], "is for --device npu"),
])
def test_bad_scheduler_input_is_one_line(argv, says, tmp_path, capsys):
    (tmp_path / "bad.json").write_text('{"hosts": ["ok", "rm -rf"]}')
    subs = {"{missing}": str(tmp_path / "exclusions.json"), "{badhosts}": str(tmp_path / "bad.json")}
    assert main(["export", "llama-3.1-8b", *[subs.get(a, a) for a in argv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dayzero: error: ") and says in err[0], err
