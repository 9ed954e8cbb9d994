#!/usr/bin/env bash
# Every GPU check, in ONE device call (a session has 15 device minutes,
# machine start included), results under $OUT (at most 8 files come back):
#   mfu      benchmarks/gpu_mfu.py       MFU of a Llama-3-8B-shaped proxy in BF16 (target >= 40 %)
#   validate benchmarks/gpu_validate.py  predicted vs measured memory (5 %) and step time (10 %)
#   ops      benchmarks/gpu_check_ops.py live CUDA dispatcher vs the shipped cuda manifest (last;
#            whatever time is left)
#
# The device image has torch, typer, rich, numpy, pyyaml, safetensors and transformers but not
# pydantic nor xxhash: carry their wheels (python 3.12, x86_64), made here once with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 xxhash==4.1.0
# then: run(command="bash benchmarks/gpu_session.sh", carry=[".whl"], timeout_s=570)
#
# DRY=1 bash benchmarks/gpu_session.sh   runs the same plumbing on CPU with tiny sizes (numbers
# meaningless): check the script here before spending device time on it.
set -u -o pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1 && [ -z "${DRY:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
LOG="$OUT/session.log"
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - start) )); }
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  $PY -c "import torch, dayzero; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} >> "$LOG" 2>&1 || { cat "$LOG"; exit 1; }

if [ -n "${DRY:-}" ]; then
  MFU_ARGS="--cpu-dry-run --layers 2 --hidden 256 --vocab 1024 --seq 128 --gbs 2 --steps 4 --warmup 1"
  VAL_ARGS="--cpu-dry-run --steps 6"
else
  MFU_ARGS=""
  VAL_ARGS=""
fi

echo "== gpu_mfu ($(left) s left)" >> "$LOG"
timeout 180 $PY benchmarks/gpu_mfu.py $MFU_ARGS --out "$OUT/gpu_mfu.json" >> "$LOG" 2>&1
echo "gpu_mfu rc=$?" >> "$LOG"

echo "== gpu_validate ($(left) s left)" >> "$LOG"
rm -rf /tmp/gpu_validate
timeout 330 $PY benchmarks/gpu_validate.py $VAL_ARGS --out /tmp/gpu_validate >> "$LOG" 2>&1
echo "gpu_validate rc=$?" >> "$LOG"
cp /tmp/gpu_validate/gpu_validate.json /tmp/gpu_validate/gpu_validate.md "$OUT"/ 2>/dev/null
cp /tmp/gpu_validate/gpu1.yaml "$OUT"/gpu1_profile.yaml 2>/dev/null

t=$(left)
if [ "$t" -gt 30 ] && [ -z "${DRY:-}" ]; then
  echo "== gpu_check_ops ($t s left)" >> "$LOG"
  OUT="$OUT" timeout $((t - 10)) $PY benchmarks/gpu_check_ops.py >> "$LOG" 2>&1
  echo "gpu_check_ops rc=$?" >> "$LOG"
fi
echo "== done after $(( $(date +%s) - start )) s" >> "$LOG"
tail -60 "$LOG"
