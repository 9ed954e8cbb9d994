"""TrainConfig in sections: round trips, the flat documents older versions wrote, the model
recipe checkpoint manifests hold, and ValidationRequest built on the same sections."""

from __future__ import annotations

import json

import pytest

from dayzero.errors import DayzeroError
from dayzero.runtime.config import (
    CheckpointSection,
    FaultSection,
    ModelSection,
    MoESection,
    OptimizerSection,
    TrainConfig,
    upgrade_flat,
)
from dayzero.specs.parallel import ParallelConfig
from dayzero.validate.run import ValidationRequest

# a <metrics>.config.json as TrainConfig.to_dict() wrote it before it had sections (every field flat)
FLAT = {"model": "tiny-llama", "parallel": {"dp": 2, "seq": 32, "gbs": 4}, "steps": 7, "seed": 3,
        "compute_dtype": "fp32", "data": None, "metrics": "m.jsonl", "quiet": True, "measure_comm": False,
        "layers": 2, "hidden": 64, "experts": None, "vocab": None, "hf_weights": None, "lr": 0.002,
        "min_lr_ratio": 0.2, "warmup": 3, "weight_decay": 0.05, "grad_clip": 0.5, "expert_bias_rate": 0.0,
        "ckpt_dir": "ck", "ckpt_every": 2, "keep": 4, "ckpt_prune_other_lineages": True, "resume": "never",
        "async_save": True, "ckpt_checksum": "sha256", "max_restarts": 1,
        "inject_faults": ["step=3,rank=0,kind=kill"], "watchdog": 30.0, "save_timeout": 5.0,
        "on_bad_loss": "skip", "spike_factor": 3.0}


def full_config() -> TrainConfig:
    return TrainConfig(model=ModelSection("tiny-llama", layers=2, hidden=64),
                       parallel=ParallelConfig(dp=2, seq=32, gbs=4),
                       optimizer=OptimizerSection(lr=0.002, min_lr_ratio=0.2, warmup=3, weight_decay=0.05,
                                                  grad_clip=0.5),
                       moe=MoESection(bias_rate=0.0),
                       checkpoint=CheckpointSection(dir="ck", every=2, keep=4, prune_other_lineages=True,
                                                    resume="never", async_save=True, checksum="sha256"),
                       faults=FaultSection(max_restarts=1, inject_faults=("step=3,rank=0,kind=kill",), watchdog=30.0,
                                           save_timeout=5.0, on_bad_loss="skip", spike_factor=3.0),
                       steps=7, seed=3, compute_dtype="fp32", metrics="m.jsonl", quiet=True, measure_comm=False)


def test_sectioned_document_round_trips(tmp_path):
    cfg = full_config()
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    cfg.save(tmp_path / "c.json")
    assert TrainConfig.load(tmp_path / "c.json") == cfg
    assert set(cfg.to_dict()) >= {"model", "parallel", "optimizer", "checkpoint", "faults", "steps"}


def test_flat_document_of_an_older_version_loads_into_the_sections(tmp_path):
    assert TrainConfig.from_dict(FLAT) == full_config()
    (tmp_path / "old.config.json").write_text(json.dumps(FLAT))
    assert TrainConfig.load(tmp_path / "old.config.json") == full_config()
    up = upgrade_flat({"model": "tiny-llama", "ckpt_dir": "ck", "lr": 0.1})
    assert up == {"model": {"name": "tiny-llama"}, "checkpoint": {"dir": "ck"}, "optimizer": {"lr": 0.1}}
    # a flat document with only some fields: the rest are the defaults
    assert TrainConfig.from_dict({"model": "tiny-llama"}) == TrainConfig(model=ModelSection("tiny-llama"))


def test_unknown_section_field_is_one_line():
    d = full_config().to_dict()
    d["checkpoint"]["ckpt_dir"] = "x"
    with pytest.raises(DayzeroError, match="section 'checkpoint': unknown field\\(s\\) ckpt_dir"):
        TrainConfig.from_dict(d)
    with pytest.raises(DayzeroError, match="section 'model': missing field\\(s\\) name"):
        TrainConfig.from_dict({"steps": 3})


def test_with_merges_section_fields():
    cfg = full_config()
    new = cfg.with_(steps=9, faults={"watchdog": 1.0})
    assert new.steps == 9 and new.faults.watchdog == 1.0 and new.faults.spike_factor == 3.0
    assert new.checkpoint == cfg.checkpoint
    assert cfg.warmup_steps == 3 and TrainConfig(model=ModelSection("x"), steps=50).warmup_steps == 5


def test_model_recipe_keeps_the_manifest_shape_and_rebuilds_the_spec():
    m = ModelSection("tiny-llama", layers=2, hidden=64, hf_weights="ignored-by-the-recipe")
    recipe = m.recipe()
    # the keys checkpoints written before sections hold in manifest model.recipe
    assert recipe == {"model": "tiny-llama", "layers": 2, "hidden": 64, "experts": None, "vocab": None}
    assert ModelSection.from_recipe(recipe).spec().digest() == m.spec().digest()
    full = ModelSection("tiny-llama").spec().digest()
    assert ModelSection.from_recipe({"model": "tiny-llama"}).spec().digest() == full
    assert m.shrink == {"layers": 2, "hidden": 64}


def test_validation_request_is_built_from_the_sections():
    req = ValidationRequest(ModelSection("tiny-llama", layers=2), ParallelConfig(dp=2, seq=32, gbs=4), steps=5,
                            optimizer=OptimizerSection(lr=0.01, grad_clip=0.3))
    assert ValidationRequest.from_dict(json.loads(json.dumps(req.to_dict()))) == req
    cfg = req.train_config()
    assert cfg.model is req.model and cfg.optimizer is req.optimizer and cfg.parallel == req.parallel
    assert (cfg.steps, cfg.compute_dtype, cfg.quiet, cfg.measure_comm) == (5, "fp32", True, True)
    assert req.shrink == {"layers": 2}
