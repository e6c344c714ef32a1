#!/usr/bin/env bash
# The gate's wall times on this machine, as a newcomer meets them, a table last:
#   bash bench/gate_timings.sh cold     # empty kernel, reference and test-pack caches: the full gate
#   bash bench/gate_timings.sh warm     # the full gate again, then the quick tier (-m quick)
#   bash bench/gate_timings.sh edit     # one kernel edited (its digest changes), the full gate
#   bash bench/gate_timings.sh workers  # the full gate (warm) at each of WORKERS (default "2 3 4 6")
#   bash bench/gate_timings.sh all      # cold, warm, edit, workers
# Caches live under $GATE_CACHES (default /tmp/gate-caches), so a cold run starts from nothing;
# logs go to $OUT (or ./gpu-logs); GATE_LIMIT (s) interrupts a run that takes longer; GATE_ARGS
# adds pytest arguments to every run (e.g. --durations=0).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
LOG=${OUT:-gpu-logs}
ROOTC=${GATE_CACHES:-/tmp/gate-caches}
mkdir -p "$LOG"
export STRATA_PREFILL_KERNEL_CACHE=$ROOTC/kernels STRATA_PREFILL_REFERENCE_CACHE=$ROOTC/reference \
       STRATA_PREFILL_TEST_PACKS=$ROOTC/packs PYTHONUNBUFFERED=1
TABLE="$LOG/gate_timings.md"
[[ -f $TABLE ]] || printf '| run | workers x threads | wall s | last line |\n|---|---|---|---|\n' > "$TABLE"

gate() {  # gate NAME [pytest args...]: one timed run, its log, a table row
  local name=$1; shift
  local t0=$SECONDS
  # SIGINT at the limit: pytest still prints its summary, durations and the gate's lines
  timeout -s INT "${GATE_LIMIT:-600}" python3 -m pytest verify/ -q -p no:cacheprovider --durations=25 ${GATE_ARGS:-} "$@" \
      > "$LOG/gate-$name.log" 2>&1
  local wall=$((SECONDS - t0))
  local plan; plan=$(grep -o '^gate: [0-9]* workers.*threads each' "$LOG/gate-$name.log" | head -n 1 | sed 's/^gate: //')
  printf '| %s | %s | %s | %s |\n' "$name" "${plan:-1 process}" "$wall" "$(tail -n 1 "$LOG/gate-$name.log")" >> "$TABLE"
  grep '^gate: ' "$LOG/gate-$name.log" | sed "s/^/  [$name] /"
}

if [[ $MODE == cold || $MODE == all ]]; then
  rm -rf "$ROOTC"
  gate cold
fi
if [[ $MODE == warm || $MODE == all ]]; then
  gate warm
  gate quick -m quick
fi
if [[ $MODE == edit || $MODE == all ]]; then
  KERNEL=fast/cuda/kernels/swiglu_q8_1.cu
  cp "$KERNEL" "$KERNEL.orig"
  echo "// gate_timings.sh: an edit that changes this kernel's digest" >> "$KERNEL"
  gate one-kernel-edit
  mv "$KERNEL.orig" "$KERNEL"
fi
if [[ $MODE == workers || $MODE == all ]]; then
  for w in ${WORKERS:-2 3 4 6}; do
    STRATA_PREFILL_WORKERS=$w gate "workers-$w"
  done
fi
echo; cat "$TABLE"
