#!/usr/bin/env bash
# The GPU part of the gate and the benchmarks, in one call on the H200 (device tool):
#   bash bench/gpu_gate.sh verify   # pytest verify/ (kernels, reference vs cuda, long-prompt arms)
#   bash bench/gpu_gate.sh bench    # MMQ TOP/s, whole prefill on a strata pack, A/B of the switches
#   bash bench/gpu_gate.sh all
# Carry .whl (PyCUDA, gguf wheels). Logs go to $OUT (or ./gpu-logs); a short table prints last.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
LOG=${OUT:-gpu-logs}
mkdir -p "$LOG"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=2
SUMMARY="$LOG/summary.txt"
: > "$SUMMARY"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$SUMMARY"

if [[ $MODE == verify || $MODE == all ]]; then
  python3 -m pytest verify/ -q -p no:cacheprovider -n 8 -k "not sim" 2>&1 | tee "$LOG/verify.log"
  echo "verify: $(tail -n 1 "$LOG/verify.log")" >> "$SUMMARY"
fi

if [[ $MODE == bench || $MODE == all ]]; then
  PACK=/tmp/strata8.gguf
  [[ -f $PACK ]] || python3 -m strata_prefill make-pack --preset strata --layers "${LAYERS:-8}" \
      --expert-type IQ2_XS --no-progress "$PACK" 2>&1 | tail -n 2
  python3 bench/bench_mmq_cuda.py 2>&1 | tee "$LOG/mmq.log" | tail -n 16 >> "$SUMMARY"
  python3 bench/bench_prefill_cuda.py --pack "$PACK" --tokens "${TOKENS:-2048,8192,32768}" 2>&1 \
      | tee "$LOG/prefill.log" | tail -n 5 >> "$SUMMARY"
  python3 bench/plot_phases.py "$LOG/prefill.log" "$LOG/prefill-phases.svg"
  python3 bench/ab.py --pack "$PACK" --a group_gather=0 --b group_gather=1 --tokens "${TOKENS:-2048,8192,32768}" \
      --reps "${REPS:-3}" 2>&1 | tee "$LOG/ab_group.log" | tail -n 5 >> "$SUMMARY"
  python3 bench/ab.py --pack "$PACK" --a quant_gather=1 --b quant_gather=0 --tokens "${TOKENS:-2048,8192,32768}" --phases \
      --reps "${REPS:-3}" 2>&1 | tee "$LOG/ab_quant.log" | tail -n 8 >> "$SUMMARY"
fi
echo; echo "==== summary ===="; cat "$SUMMARY"
