"""Saved-activation bytes per token per layer of never-seen models' approximated layers: the planner's
terms before the trace, the model's own code traced at a third length, and the planner after
(dayzero.derive.traced_act: the layers traced at two lengths, fitted linear + quadratic in seq).

Columns, per group of traced layers with one difference (bytes per token per layer, one sequence of
``--seq`` tokens, no parallelism):
  eager before   the planner's eager terms as the reference code runs (traced_act.reference_bytes:
                 MemoryOptions(kernels="eager", attention="eager") plus transformers' FP32 softmax and
                 repeated K/V; a stand-in mixer's core at its fused figure)
  traced         SavedTensors over a forward of the model's own code at --seq (not a fitted length)
  eager after    eager before + the layer's fitted difference (ModelSpec.layer_act_extra, or
                 layer_act_reference for an unread mixer), against traced; "mixer side": the same for
                 the side the difference is taken on (a feed-forward block read from its shapes keeps
                 the planner's terms, so the whole layer differs from the trace by that block's)
  fused before / after   what a plan counts by default (MemoryOptions(): fused kernels), without and
                 with the traced term (per layer, not the mean per layer type the planner applies; an
                 unread mixer's reference bytes count under eager kernels only)

    PYTHONPATH=src python benchmarks/traced_act_bytes.py [--seq 1024] [--types qwen3_next,minimax,...]
"""

from __future__ import annotations

import tempfile


def main() -> None:
    from hf_defaults import default_config_models, parse_args

    args = parse_args()
    from dayzero.derive.to_spec import ranges
    from dayzero.derive.traced_act import reference_bytes, reference_only, stand_ins, traced_sides, unread_ffns
    from dayzero.derive.traced_flops import approximated_layers
    from dayzero.ops.hf_model import build_meta_model
    from dayzero.ops.trace import _run
    from dayzero.planner.memory.activations import Dims, layer_terms
    from dayzero.planner.memory.memory_options import MemoryOptions

    s = args.seq
    print(f"| model_type | layers | mixer, ffn | load s | eager before | traced (seq {s}) | eager after | "
          "mixer side after vs traced | fused before | fused after |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for mt, d, spec, load in default_config_models(args.types.split(","), tmp):
            desc = spec.extra["description"]
            layers = approximated_layers(desc, spec)
            if not layers:
                print(f"| {mt} | none traced | | {load:.1f} | | | | | | |")
                continue
            meta = build_meta_model(str(d))
            tr = _run(meta, s, 1, "bfloat16", backward=False, saved=True)
            rep = {i: k for k, kind in enumerate(meta.kinds) for i in kind.layers}
            kinds = desc.kind_of()
            standin, unread, ref_only = stand_ins(desc), unread_ffns(desc), reference_only(desc, spec)
            groups: dict[tuple, list[int]] = {}
            for i in layers:
                field = spec.layer_act_reference if i in ref_only else spec.layer_act_extra
                groups.setdefault((field[i], rep[i]), []).append(i)
            for ((lin, quad), k), idx in groups.items():
                i = idx[0]
                kd = kinds[i]
                ref = reference_bytes(spec, i, s, i in standin)
                sides = traced_sides(tr.saved_bytes, k, kd.ffn.modules, s)
                before, traced, x = sum(ref), sum(sides), lin + quad * s
                after = before + x
                side = (after, traced) if i in unread else (ref[0] + x, sides[0])
                fused = layer_terms(spec, spec.layer_types[i], MemoryOptions(), Dims(seq=s, mbs=1, tp=1, cp=1))
                fb = sum(float(v) for n, v in fused.items() if n != "traced_extra") / s
                what = f"{kd.mixer.module if kd.mixer else 'none'}, {kd.ffn.kind}"
                print(f"| {mt} | {ranges(tuple(idx))} | {what} | {load:.1f} | {before:,.0f} | {traced:,.0f} | "
                      f"{after:,.0f} ({(after - traced) / traced:+.2%}) | {(side[0] - side[1]) / side[1]:+.2%} | "
                      f"{fb:,.0f} | {fb + (0 if i in ref_only else x):,.0f} |")


if __name__ == "__main__":
    main()
