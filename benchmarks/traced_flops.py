"""Forward FLOPs per token of never-seen models: the shapes alone, and with the layers the shapes
only approximate traced at two lengths (dayzero.derive.traced_flops), against a trace of the whole
model's own code at a third length (eager attention over every key: windows and causal masks are
compared as the reference computes them, i.e. non-causal and without windows).

    PYTHONPATH=src python benchmarks/traced_flops.py [--seq 1024] [--types minimax,deepseek_v32,...]
"""

from __future__ import annotations

import tempfile
from dataclasses import replace


def main() -> None:
    from hf_defaults import default_config_models, parse_args

    args = parse_args()
    from dayzero.derive.traced_flops import reference_spec
    from dayzero.ops.hf_model import build_meta_model
    from dayzero.ops.trace import _run
    from dayzero.specs.counting import flops_per_token

    s = args.seq
    print(f"| model_type | load s | traced forward FLOPs/token (seq {s}) | shapes only | with traced layers |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for mt, d, spec, load in default_config_models(args.types.split(","), tmp):
            tr = _run(build_meta_model(str(d)), s, 1, "bfloat16", backward=False)
            got = sum(c.flops * tr.multiplier(c) for c in tr.calls if c.phase == "forward") / tr.tokens
            ref = reference_spec(spec.extra["description"], spec)
            after = flops_per_token(ref, s, causal=False).forward
            before = flops_per_token(replace(ref, layer_flops_extra=()), s, causal=False).forward
            print(f"| {mt} | {load:.1f} | {got:.4g} | {before:.4g} ({(before - got) / got:+.2%}) | "
                  f"{after:.4g} ({(after - got) / got:+.2%}) |")


if __name__ == "__main__":
    main()
