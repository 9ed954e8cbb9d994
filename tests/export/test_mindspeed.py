"""MindSpeed-LLM: the export's arguments parse with Megatron-LM's and MindSpeed's published argument
definitions (no MindSpeed package here: the definitions are the table below, each with its source
file), export -> import gives the same layout, no CUDA-only flag reaches an Ascend plan, and the
Ascend catalog entries and cluster presets carry sources."""

from __future__ import annotations

import argparse

import pytest

from dayzero.errors import ConfigError, LayoutError
from dayzero.export import megatron, mindspeed
from dayzero.planner.engines import FEATURES, default_engine, engines_for, runs_on_vendor
from dayzero.specs.cluster import cluster_presets, get_cluster
from dayzero.specs.hardware import catalog
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model, model_presets

MEGATRON_ARGS = "Megatron-LM megatron/training/arguments.py (core_v0.12, MindSpeed-LLM's base)"
MS = "github.com/Ascend/MindSpeed @028de58 "
# flag -> (kind, source): "value" takes one word, "true" is store_true, "list" takes one or more
DEFINITIONS: dict[str, tuple[str, str]] = {
    **{f: ("value", MEGATRON_ARGS) for f in (
        "--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--max-position-embeddings",
        "--vocab-size", "--position-embedding-type", "--normalization", "--norm-epsilon", "--kv-channels",
        "--rotary-base", "--rope-type", "--num-query-groups", "--kv-lora-rank", "--qk-head-dim",
        "--qk-pos-emb-head-dim", "--v-head-dim", "--q-lora-rank", "--num-experts", "--moe-router-topk",
        "--moe-ffn-hidden-size", "--moe-token-dispatcher-type", "--moe-shared-expert-intermediate-size",
        "--moe-router-score-function", "--moe-router-topk-scaling-factor", "--moe-router-num-groups",
        "--moe-router-group-topk", "--moe-layer-freq", "--mtp-num-layers", "--make-vocab-size-divisible-by",
        "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
        "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--micro-batch-size",
        "--global-batch-size", "--seq-length", "--num-layers-per-virtual-pipeline-stage",
        "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--rope-scaling-factor",
        "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--softmax-type", "--window-size",
        "--window-attn-skip-freq", "--glu-linear-offset", "--activation-func-clamp-value")},
    **{f: ("true", MEGATRON_ARGS) for f in (
        "--group-query-attention", "--multi-latent-attention", "--swiglu", "--untie-embeddings-and-output-weights",
        "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--moe-grouped-gemm",
        "--moe-router-enable-expert-bias", "--moe-router-pre-softmax", "--moe-shared-expert-gate",
        "--rotary-interleaved", "--use-rope-scaling", "--quick-geglu", "--bf16", "--sequence-parallel",
        "--use-distributed-optimizer", "--use-flash-attn")},
    "--use-fused-rmsnorm": ("true", MS + "mindspeed/arguments.py _add_network_size_args"),
    "--use-fused-swiglu": ("true", MS + "mindspeed/arguments.py _add_network_size_args"),
    "--use-fused-rotary-pos-emb": ("true", MS + "mindspeed/arguments.py _add_network_size_args"),
    "--swap-optimizer": ("true", MS + "mindspeed/features_manager/optimizer/swap_optimizer_feature.py"),
    "--reuse-fp32-param": ("true", MS + "mindspeed/features_manager/memory/reuse_fp32_param.py"),
    "--recompute-activation-function": ("true", MS + "mindspeed/arguments.py _add_recompute_args"),
    "--recompute-norm": ("true", MS + "mindspeed/arguments.py _add_recompute_args"),
    "--moe-fb-overlap": ("true", MS + "mindspeed/features_manager/moe/fb_overlap.py"),
    "--moe-alltoall-overlap-comm": ("true", MS + "mindspeed/arguments.py _add_moe_args"),
    "--schedules-method": ("value", MS + "mindspeed/features_manager/pipeline_parallel/dualpipev_feature.py"),
    "--context-parallel-algo": ("value", MS + "mindspeed/arguments.py _add_cp_args"),
}
CHOICES = {"--schedules-method": ("dualpipev",),
           "--context-parallel-algo": ("ulysses_cp_algo", "megatron_cp_algo", "hybrid_cp_algo",
                                       "adaptive_cp_algo", "hybrid_adaptive_cp_algo"),
           "--moe-token-dispatcher-type": ("allgather", "alltoall", "alltoall_seq", "flex")}


class _Strict(argparse.ArgumentParser):
    def error(self, message):
        raise AssertionError(message)


def parser() -> argparse.ArgumentParser:
    ap = _Strict(add_help=False, allow_abbrev=False)
    for flag, (kind, _) in DEFINITIONS.items():
        if kind == "true":
            ap.add_argument(flag, action="store_true")
        else:
            ap.add_argument(flag, choices=CHOICES.get(flag))
    return ap


LAYOUTS = [
    ParallelConfig(tp=2, pp=8, dp=32, ep=32, vpp=2, schedule="dualpipev", mbs=1, gbs=3840, seq=4096, zero=1,
                   recompute="full", recompute_layers=2, sequence_parallel=True, optimizer_offload=True),
    ParallelConfig(tp=4, pp=4, dp=8, ep=8, vpp=2, mbs=1, gbs=256, seq=4096, zero=1, recompute="selective",
                   recompute_modules=("core_attn", "moe_act"), sequence_parallel=True),
    ParallelConfig(tp=2, pp=1, dp=16, cp=2, cp_comm="a2a", ep=16, mbs=1, gbs=64, seq=8192, zero=1,
                   recompute="selective", recompute_modules=("layernorm",), sequence_parallel=True),
    ParallelConfig(tp=8, pp=2, dp=4, cp=2, cp_comm="p2p", mbs=1, gbs=64, seq=8192, zero=0, recompute="full"),
]


@pytest.mark.parametrize("p", LAYOUTS, ids=lambda p: p.describe())
def test_every_exported_flag_is_defined_and_parses(p):
    spec = load_model("deepseek-v3" if p.ep > 1 else "llama-3.1-70b")
    args, _ = mindspeed.arguments(spec, p)
    ns = parser().parse_args(args)
    assert ns.tensor_model_parallel_size == str(p.tp)
    assert ns.moe_token_dispatcher_type in (None, "alltoall")


def test_the_parser_fails_on_an_unknown_flag():
    with pytest.raises(AssertionError, match="unrecognized"):
        parser().parse_args(["--tensor-model-parallel-size", "2", "--tp-comm-overlap"])


def test_every_definition_names_its_source():
    assert all(src for _, src in DEFINITIONS.values())


@pytest.mark.parametrize("p", LAYOUTS, ids=lambda p: p.describe())
def test_export_import_round_trip(tmp_path, p):
    spec = load_model("deepseek-v3" if p.ep > 1 else "llama-3.1-70b")
    paths = mindspeed.export(spec, p).write(tmp_path)
    for path in paths:  # the argument file and the launch script read back alike
        back, _ = mindspeed.import_file(path, p.world)
        assert back == p


def test_import_reads_a_recipe_style_script_with_variables(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/bash\nsource /usr/local/Ascend/ascend-toolkit/set_env.sh\nTP=2\nPP=8\nEP=32\n'
                      'GPT_ARGS="\n    --tensor-model-parallel-size ${TP} \\\n'
                      '    --pipeline-model-parallel-size $PP \\\n'
                      '    --expert-model-parallel-size ${EP} \\\n    --schedules-method dualpipev \\\n'
                      '    --recompute-granularity full --recompute-method block --recompute-num-layers 8 \\\n'
                      '    --use-distributed-optimizer --swap-optimizer --sequence-parallel \\\n'
                      '    --micro-batch-size 1 --global-batch-size 3840 --seq-length 4096 --noop-layers 61,62,63\n"\n'
                      'torchrun --nproc_per_node 16 --nnodes 32 pretrain_gpt.py $GPT_ARGS --bf16 | tee log\n')
    p, notes = mindspeed.import_file(script, 512)
    assert (p.tp, p.pp, p.ep, p.dp, p.schedule, p.vpp, p.recompute_layers) == (2, 8, 32, 32, "dualpipev", 2, 8)
    assert p.optimizer_offload and p.zero == 1
    assert any("--noop-layers" in n for n in notes)


CUDA_ONLY = {w for f in FEATURES.values() for w in f.flag.split() if w.startswith("--")} - {
    "--moe-token-dispatcher-type"} | {"deepep", "flex", "--overlap-moe-expert-parallel-comm", "--fp8-format"}
ASCEND = [n for n, _ in cluster_presets().items() if get_cluster(n).accelerator.vendor.lower() == "huawei"]


def _layout(spec, world: int) -> ParallelConfig:
    ep = next(e for e in (8, 4, 2, 1) if not spec.is_moe or spec.moe.experts % e == 0) if spec.is_moe else 1
    pp = 2 if spec.layers >= 4 else 1
    return ParallelConfig(tp=2, pp=pp, dp=world // (2 * pp), ep=ep, mbs=1, gbs=world, seq=4096, zero=1,
                          sequence_parallel=True)


@pytest.mark.parametrize("cluster", ASCEND)
@pytest.mark.parametrize("model", list(model_presets()))
def test_no_cuda_only_flag_in_any_export_to_an_ascend_cluster(model, cluster):
    cl, spec = get_cluster(cluster), load_model(model)
    p = _layout(spec, min(cl.devices, 64))
    vendor = cl.accelerator.vendor
    assert default_engine(vendor) == "mindspeed" and not runs_on_vendor("megatron", vendor)
    lists = []
    for build in (lambda: mindspeed.arguments(spec, p)[0],
                  lambda: megatron.export(spec, p, vendor=vendor).files[megatron.ARGS_FILE].split()):
        try:
            lists.append(build())
        except ConfigError as e:  # a layer kind pretrain_gpt.py cannot build is refused, never approximated
            assert "pretrain_gpt.py builds attention" in str(e)
    for words in lists:
        assert not CUDA_ONLY & set(words), (model, cluster, CUDA_ONLY & set(words))


def test_megatron_fsdp_is_refused_on_ascend_and_megatron_is_not_an_ascend_engine():
    spec = load_model("llama-3.1-8b")
    p = ParallelConfig(tp=1, pp=1, dp=16, mbs=1, gbs=16, seq=4096, zero=3)
    with pytest.raises(ConfigError, match="Megatron FSDP"):
        megatron.export(spec, p, vendor="Huawei")
    assert "--use-megatron-fsdp" in megatron.export(spec, p, vendor="NVIDIA").files[megatron.ARGS_FILE]
    assert "megatron" not in engines_for(p.with_(zero=1), vendor="Huawei")
    assert "mindspeed" in engines_for(p.with_(zero=1), vendor="Huawei")
    with pytest.raises(LayoutError, match="MindSpeed"):
        mindspeed.arguments(spec, p)


def test_ascend_catalog_entries_and_presets_carry_sources():
    huawei = [a for a in catalog().values() if a.vendor.lower() == "huawei"]
    assert {"huawei_ascend_910b", "huawei_ascend_910c", "huawei_ascend_910c_die"} <= {a.id for a in huawei}
    assert all(a.sources for a in huawei)
    die, package = catalog()["huawei_ascend_910c_die"], catalog()["huawei_ascend_910c"]
    assert die.peak_flops["bf16"] * 2 == package.peak_flops["bf16"] and die.hbm_bytes * 2 == package.hbm_bytes
    for name in ASCEND:
        text = cluster_presets()[name].read_text()
        assert text.startswith("#") and ("catalog" in text or "arXiv" in text)


def test_the_published_mindspeed_recipe_layout_is_kept_by_the_search():
    """MindSpeed-LLM examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_A3_ptd.sh: TP2 PP8 EP32,
    DualPipeV, full recompute, swap-optimizer, on 32 x 16 A3 dies."""
    from dayzero.planner.search import SearchSpace, plan

    spec, cl = load_model("deepseek-v3"), get_cluster("atlas900-a3-superpod-512")
    obj = plan(spec, cl, 3840, 4096, top_k=2, space=SearchSpace(tp=(2,), pp=(8,), ep=(32,), etp=(1,),
                                                                 schedule=("dualpipev",)))
    best = obj["plans"][0]
    assert best["engines"] == ["mindspeed"] and best["parallel"]["schedule"] == "dualpipev"
    assert obj["vendor"] == "Huawei"


def test_a_plan_on_ascend_is_searched_for_mindspeed_and_refuses_megatron():
    from dayzero.planner.search import SearchSpace, plan

    spec, cl = load_model("tiny-moe"), get_cluster("atlas800t-a3-512")
    obj = plan(spec, cl, 512, 1024, top_k=1)
    engines = obj["plans"][0]["engines"]  # DeepSpeed and the runtime run on any PyTorch device
    assert "mindspeed" in engines and "megatron" not in engines and obj["vendor"] == "Huawei"
    assert obj["plans"][0]["moe_dispatch"]["dispatcher"] == "all_to_all"  # MindSpeed's, without DeepEP
    with pytest.raises(ConfigError, match="not Huawei's"):
        plan(spec, cl, 512, 1024, top_k=1, space=SearchSpace(engine="megatron"))


def test_cli_plan_export_import_on_an_a3_cluster(tmp_path, capsys):
    """`dayzero plan` on an A3 preset -> `export --to mindspeed` -> `import`: the same layout, no CUDA-only flag,
    and `--to megatron` of the same plan substitutes the DeepEP dispatcher with a note."""
    import json

    from dayzero.cli.app import main

    def run(argv):
        rc = main(argv)
        out = capsys.readouterr()
        assert rc == 0, out.err
        return out.out

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(run(["plan", "tiny-moe", "--cluster", "atlas800t-a3-512", "--gbs", "512", "--seq", "1024",
                              "--top", "1", "--json"]))
    best = json.loads(plan_file.read_text())["plans"][0]
    assert "mindspeed" in best["engines"] and best["moe_dispatch"]["dispatcher"] == "all_to_all"
    out = json.loads(run(["export", str(plan_file), "--to", "mindspeed", "-o", str(tmp_path / "ms"), "--json"]))
    words = set(" ".join(out["files"].values()).split())
    assert not CUDA_ONLY & words and "--use-fused-rmsnorm" in words
    back = json.loads(run(["import", str(tmp_path / "ms" / mindspeed.SCRIPT_FILE), "--devices", "512", "--json"]))
    assert back["engine"] == "mindspeed"
    assert ParallelConfig.from_dict(back["parallel"]) == ParallelConfig.from_dict(best["parallel"]).with_(
        layer_split=None)
    if best["parallel"]["ep"] > 1:
        meg = json.loads(run(["export", str(plan_file), "--to", "megatron", "--json"]))
        assert "deepep" not in meg["files"][megatron.ARGS_FILE] and any("DeepEP" in u for u in meg["unexpressed"])


def test_the_plans_next_step_export_runs_with_the_optimizer_offload(tmp_path):
    """`dayzero plan` on an Ascend cluster ends with `export --to mindspeed ... --optimizer-offload`
    where its plan offloads the optimizer: MindSpeed writes it as --swap-optimizer."""
    from dayzero.cli.app import main

    out = tmp_path / "ms"
    assert main(["export", "llama-3.1-8b", "--to", "mindspeed", "--tp", "8", "--pp", "2", "--dp", "4", "--gbs", "64",
                 "--zero", "1", "--sequence-parallel", "--optimizer-offload", "--devices", "64", "-o", str(out)]) == 0
    assert "--swap-optimizer" in (out / "mindspeed_args.txt").read_text().split()
