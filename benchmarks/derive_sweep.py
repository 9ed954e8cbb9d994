"""Describe every causal-LM type transformers ships (default config, meta device, `describe_module`)
and write one line per type: total, final norm, outside parameters, norm kind, and per layer kind its
mixer, feed-forward block, experts, shared width and unread parameters. Run it on two checkouts and
diff the files to see which types a change to dayzero.derive reads differently (about 90 s).

    PYTHONPATH=src python benchmarks/derive_sweep.py OUT.txt
"""

from __future__ import annotations

import signal
import sys
import warnings


def _timeout(*_):
    raise TimeoutError


def _kind_line(k) -> str:
    mix = "&".join(f"{m.kind}:{m.module}" + (f":{m.recurrent.kind}" if m.recurrent else "")
                   for m in (k.mixer, getattr(k, "beside", None)) if m) or None  # beside: mixers side by side
    experts = k.ffn.experts.experts if k.ffn.experts else 0
    shared = k.ffn.shared.intermediate if k.ffn.shared else 0
    return (f"{k.name} L{len(k.layers)} mix={mix} ffn={k.ffn.kind}:{k.ffn.module} E={experts} sh={shared} "
            f"other={k.other}")


def describe_type(mt: str, config_mapping) -> str:
    """One line for a model type: its description on the meta device, or the error building it."""
    import torch
    import transformers

    from dayzero.derive.describe import describe_module
    from dayzero.ops.hf_model import _quiet_transformers

    cfg = config_mapping[mt]()
    with _quiet_transformers(), torch.device("meta"):
        net = transformers.AutoModelForCausalLM.from_config(cfg)
    d = describe_module(net, cfg, mt, mt)
    head = f"{mt}: total={d.total} fn={d.final_norm} out={d.outside} norm={d.norm}{d.norm_bias} "
    return head + " | ".join(_kind_line(k) for k in d.kinds)


def main() -> None:
    warnings.filterwarnings("ignore")
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    transformers.logging.set_verbosity_error()
    signal.signal(signal.SIGALRM, _timeout)
    with open(sys.argv[1], "w") as out:
        for mt in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
            if mt not in CONFIG_MAPPING:
                continue
            signal.alarm(20)
            try:
                line = describe_type(mt, CONFIG_MAPPING)
            except BaseException as e:  # one type's failure is a line of the sweep, not its end
                line = f"{mt}: ERROR {type(e).__name__} {str(e)[:80]}"
            finally:
                signal.alarm(0)
            print(line, file=out, flush=True)


if __name__ == "__main__":
    main()
