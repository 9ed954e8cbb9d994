"""Describe every causal-LM type transformers ships (default config, meta device, `describe_module`)
and write one line per type: total, final norm, outside parameters, norm kind, and per layer kind its
mixer, feed-forward block, experts, shared width and unread parameters. Run it on two checkouts and
diff the files to see which types a change to dayzero.derive reads differently (about 90 s).

    PYTHONPATH=src python benchmarks/derive_sweep.py OUT.txt
"""
import sys, time, signal, warnings, logging
warnings.filterwarnings("ignore")
import torch, transformers
transformers.logging.set_verbosity_error()
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from dayzero.derive.describe import describe_module
from dayzero.ops.hf_model import _quiet_transformers
def h(*a): raise TimeoutError
signal.signal(signal.SIGALRM, h)
out = open(sys.argv[1], "w")
for mt in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
    if mt not in CONFIG_MAPPING: continue
    signal.alarm(20)
    try:
        cfg = CONFIG_MAPPING[mt]()
        with _quiet_transformers(), torch.device("meta"):
            net = transformers.AutoModelForCausalLM.from_config(cfg)
        d = describe_module(net, cfg, mt, mt)
        line = f"{mt}: total={d.total} fn={d.final_norm} out={d.outside} norm={d.norm}{d.norm_bias} " + " | ".join(
            f"{k.name} L{len(k.layers)} mix={k.mixer.kind + ':' + k.mixer.module + (':' + k.mixer.recurrent.kind if k.mixer.recurrent else '') if k.mixer else None} "
            f"ffn={k.ffn.kind}:{k.ffn.module} E={k.ffn.experts.experts if k.ffn.experts else 0} sh={k.ffn.shared.intermediate if k.ffn.shared else 0} other={k.other}"
            for k in d.kinds)
    except BaseException as e:
        line = f"{mt}: ERROR {type(e).__name__} {str(e)[:80]}"
    finally:
        signal.alarm(0)
    print(line, file=out, flush=True)
