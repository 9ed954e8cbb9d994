"""Kubernetes: a Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``) that runs a plan on dayzero's runtime,
in a ``Namespace`` of its own with a ``ResourceQuota`` (the job's independent resource partition).

One worker pod per node, each holding all of that node's devices (``nvidia.com/gpu`` or the
Ascend device plugin's ``huawei.com/Ascend910``), so each tensor-parallel group stays inside one
node (:func:`dayzero.export.job.node_split`); a required pod anti-affinity on the hostname keeps
two of the job's pods off one node, and a node affinity keeps the excluded hosts out. ``torchrun``
in each pod takes its node count and c10d rendezvous from the operator (the ``PET_*`` variables
it sets from ``elasticPolicy``); the layout fixes the world size, so ``minReplicas`` =
``maxReplicas`` = the node count and elasticity is the c10d rendezvous plus ``maxRestarts``
restarts. A failed pod restarts (``OnFailure``) and ``dayzero train --resume auto`` picks up from
the newest good checkpoint on the shared volume.

Fields: the training operator's PyTorchJob API
(https://www.kubeflow.org/docs/components/training/user-guides/pytorch/ and
https://github.com/kubeflow/training-operator/blob/master/docs/api/kubeflow.org_v1_generated.asciidoc);
quotas on extended resources take only the ``requests.`` prefix
(https://kubernetes.io/docs/concepts/policy/resource-quotas/#resource-quota-for-extended-resources).
"""

from __future__ import annotations

import re

from dayzero.errors import ConfigError, LayoutError
from dayzero.export.common import Export
from dayzero.export.job import (
    MEGATRON_HOME,
    TORCHTITAN_CONFIG,
    JobOptions,
    Launch,
    Paths,
    comm_env,
    expand_hosts,
    launch,
    node_split,
    time_limit_seconds,
)
from dayzero.export.quoting import Ref, container_arg, yaml_documents
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

MANIFEST_FILE = "pytorchjob.yaml"
# extended resource names of the device plugins: https://github.com/NVIDIA/k8s-device-plugin (nvidia.com/gpu),
# https://github.com/Ascend/ascend-device-plugin (huawei.com/Ascend910)
DEVICE_RESOURCE = {"cuda": "nvidia.com/gpu", "npu": "huawei.com/Ascend910"}
CONTAINER = "pytorch"  # the container name the training operator looks for in a PyTorchJob's pods
JOB_LABEL = "dayzero.job"
MOUNT = "/runs"  # where the shared volume is mounted when --run-dir is relative
# defaults of a pod's size, per device, when --cpus-per-node / --mem-per-node are not given
CPUS_PER_DEVICE, MEM_GB_PER_DEVICE = 4, 32
CPU_RANK_CPUS, CPU_RANK_MEM_GB = 1, 4
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def pod_size(job: JobOptions, per_node: int) -> tuple[int, int]:
    """(cores, GiB of memory) each pod requests."""
    cpus, mem = (CPU_RANK_CPUS, CPU_RANK_MEM_GB) if job.device == "cpu" else (CPUS_PER_DEVICE, MEM_GB_PER_DEVICE)
    return job.cpus_per_node or cpus * per_node, job.memory_gb or mem * per_node


def run_path(job: JobOptions) -> str:
    run = job.run_dir.rstrip("/") or "/"
    return run if run.startswith("/") else f"{MOUNT}/{run}"


ENGINE_FILES = "/etc/dayzero"  # where the ConfigMap of the engine's files is mounted


def container_command(launch: Launch, per_node: int, nodes: int) -> list[str]:
    """The container's command: torchrun, whose node count and rendezvous the operator gives (the
    ``PET_*`` variables of ``elasticPolicy``), or DeepSpeed's launcher without ssh, told its node
    rank and the first pod's address by the operator's ``RANK`` (the pod's index in a v1 PyTorchJob),
    ``MASTER_ADDR`` and ``MASTER_PORT`` (set on every replica of a PyTorchJob without elasticPolicy;
    the training operator's PyTorchJob guide); the node count is the layout's."""
    if launch.launcher == "deepspeed":
        return ["deepspeed", "--no_ssh", Ref("--node_rank=$(RANK)"), Ref("--master_addr=$(MASTER_ADDR)"),
                Ref("--master_port=$(MASTER_PORT)"), f"--num_nodes={nodes}", f"--num_gpus={per_node}",
                *launch.program]
    return ["torchrun", f"--nproc-per-node={per_node}", *launch.program]


def node_launch(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions, model_config: dict | None) -> Launch:
    run = run_path(job)
    return launch(spec, parallel, job, Paths(ckpt=f"{run}/ckpt", metrics=f"{run}/metrics.jsonl", files=ENGINE_FILES,
                                             style="container"), model_config)


def pod_template(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions, per_node: int,
                 run_launch: Launch | None = None) -> dict:
    """The worker pods' template (a ``V1PodTemplateSpec``)."""
    cpus, mem = pod_size(job, per_node)
    limits = {"cpu": str(cpus), "memory": f"{mem}Gi"}
    if job.device in DEVICE_RESOURCE:
        limits[DEVICE_RESOURCE[job.device]] = str(per_node)
    run = run_path(job)
    started = run_launch or node_launch(spec, parallel, job, None)
    nodes = parallel.world // per_node
    command = [container_arg(w, "a launch argument", CONTAINER_VARS)
               for w in container_command(started, per_node, nodes)]
    env = [{"name": k, "value": v} for k, v in {**comm_env(job), **started.env}.items()]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "run", "mountPath": run if job.run_dir.startswith("/") else MOUNT}]
    if started.files:
        mounts.append({"name": "engine", "mountPath": ENGINE_FILES, "readOnly": True})
    container = {"name": CONTAINER, "image": job.image, "command": command, "env": env,
                 "resources": {"requests": dict(limits), "limits": limits}, "volumeMounts": mounts}
    affinity: dict = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {JOB_LABEL: job.name}}, "topologyKey": "kubernetes.io/hostname"}]}}
    if job.exclude:
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                  "values": expand_hosts(job.exclude)}]}]}}
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{max(1, mem // 2)}Gi"}},
               {"name": "run", "persistentVolumeClaim": {"claimName": claim(job)}}]
    if started.files:
        volumes.append({"name": "engine", "configMap": {"name": f"{job.name}-engine"}})
    pod: dict = {"containers": [container], "affinity": affinity, "volumes": volumes}
    if job.device == "cuda":  # GPU nodes are commonly tainted so that only pods asking for GPUs land there
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": {JOB_LABEL: job.name}}, "spec": pod}


# the container variables a word the exporter built may refer to (quoting.Ref): the operator's and the launch's
CONTAINER_VARS = frozenset(("RANK", "MASTER_ADDR", "MASTER_PORT", MEGATRON_HOME, TORCHTITAN_CONFIG))


def claim(job: JobOptions) -> str:
    return job.volume_claim or f"{job.name}-run"


def manifests(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions, model_config: dict | None = None,
              run_launch: Launch | None = None) -> list[dict]:
    """[Namespace, ResourceQuota, (ConfigMap of the engine's files,) PyTorchJob] of the plan."""
    if not _DNS_LABEL.fullmatch(job.name) or len(job.name) > 63:
        raise ConfigError("--job-name", None, f"{job.name!r}: Kubernetes names the namespace after the job: lowercase "
                          "letters, digits and '-', starting and ending with a letter or digit")
    if not job.image:
        raise ConfigError("--image", None, "Kubernetes needs the container image with dayzero installed")
    split = node_split(parallel, job.devices_per_node, "Kubernetes")
    cpus, mem = pod_size(job, split.per_node)
    hard = {"pods": str(split.nodes), "requests.cpu": str(cpus * split.nodes),
            "limits.cpu": str(cpus * split.nodes), "requests.memory": f"{mem * split.nodes}Gi",
            "limits.memory": f"{mem * split.nodes}Gi", "persistentvolumeclaims": "1"}
    if job.device in DEVICE_RESOURCE:
        hard[f"requests.{DEVICE_RESOURCE[job.device]}"] = str(split.per_node * split.nodes)
    labels = {JOB_LABEL: job.name}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": job.name, "labels": labels}}
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": f"{job.name}-quota", "namespace": job.name}, "spec": {"hard": hard}}
    started = run_launch or node_launch(spec, parallel, job, model_config)
    run_policy: dict = {"backoffLimit": job.max_requeues, "cleanPodPolicy": "None"}
    if job.time_limit:
        run_policy["activeDeadlineSeconds"] = time_limit_seconds(job.time_limit)
    pytorchjob = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": job.name, "namespace": job.name, "labels": {JOB_LABEL: job.name}},
        "spec": {
            "runPolicy": run_policy,
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": split.nodes, "maxReplicas": split.nodes,
                              "maxRestarts": job.max_requeues},
            "nprocPerNode": str(split.per_node),
            "pytorchReplicaSpecs": {"Worker": {"replicas": split.nodes, "restartPolicy": "OnFailure",
                                               "template": pod_template(spec, parallel, job, split.per_node,
                                                                        started)}}}}
    if started.launcher == "deepspeed":  # its launcher takes RANK/MASTER_ADDR, set without elasticPolicy
        del pytorchjob["spec"]["elasticPolicy"]
    docs = [namespace, quota]
    if started.files:
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": f"{job.name}-engine", "namespace": job.name, "labels": labels},
                     "data": dict(started.files)})
    return docs + [pytorchjob]


def export(spec: ModelSpec, parallel: ParallelConfig, nodes: int | None = None, devices_per_node: int = 8,
           job: JobOptions | None = None, model_config: dict | None = None) -> Export:
    job = job or JobOptions(devices_per_node=devices_per_node)
    started = node_launch(spec, parallel, job, model_config)
    docs = manifests(spec, parallel, job, model_config, started)
    got = docs[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    if nodes is not None and nodes != got:
        raise LayoutError(f"{parallel.world} ranks at {job.devices_per_node} per node take {got} node(s), not {nodes}")
    missing = list(started.unexpressed)
    if TORCHTITAN_CONFIG in started.env:
        missing.append(f"{TORCHTITAN_CONFIG}: set the container's variable to the config_registry function of "
                       f"{spec.name}")
    if job.partition:
        missing.append(f"partition {job.partition} (Kubernetes has no partitions: the namespace's quota is the job's "
                       "share; pick nodes with a node selector)")
    missing.append("exclusive nodes (each pod takes all its node's devices and no two of the job's pods share a node, "
                   "but other jobs' device-less pods may still land there)")
    if job.time_limit:
        missing.append("a warning before the time limit (pods stop at activeDeadlineSeconds; a rerun resumes from the "
                       "last checkpoint)")
    text = yaml_documents(docs, files=tuple(d["data"] for d in docs if d["kind"] == "ConfigMap"))
    return Export("kubernetes", {MANIFEST_FILE: text}, ["kubectl", "apply", "-f", MANIFEST_FILE], missing)
