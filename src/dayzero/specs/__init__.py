"""Specs: what the model is (ModelSpec), what the cluster is (Cluster), and how it is split
(ParallelConfig). Pure Python; never imports torch."""

from dayzero.specs.cluster import Cluster, Tier, build_cluster, get_cluster, resolve_cluster
from dayzero.specs.hardware import Accelerator, catalog, get_accelerator
from dayzero.specs.model import AttentionSpec, MLPSpec, ModelSpec, MoESpec
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model, model_presets

__all__ = ["Accelerator", "AttentionSpec", "Cluster", "MLPSpec", "ModelSpec", "MoESpec", "ParallelConfig",
           "Tier", "build_cluster", "catalog", "get_accelerator", "get_cluster", "load_model",
           "model_presets", "resolve_cluster"]
