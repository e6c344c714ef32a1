#!/usr/bin/env bash
# The GPU part of the gate and the benchmarks, in one call on a GPU machine:
#   bash bench/gpu_gate.sh verify   # pytest verify/ (kernels, reference vs cuda, long-prompt arms)
#   bash bench/gpu_gate.sh bench    # MMQ TOP/s, whole prefill on a strata pack, its phases against the
#                                   # contract's floors (phase_floors.json/.png) and trace (timing.log,
#                                   # trace.json, trace-chunk0.png), A/B of the switches
#   bash bench/gpu_gate.sh all
#   bash bench/gpu_gate.sh suites   # the pytest-benchmark GPU suites (bench/test_bench_*_cuda.py), saved
#                                   # under $LOG/benchmarks; not part of `all`
#   bash bench/gpu_gate.sh kernels  # kernel configurations A/B, interleaved (the attention kernels' forms,
#                                   # float_dense warp/tile, dense MMQ's, combine, a layer's experts gathered or in
#                                   # place), the mma probe and MMQ's core forms (dev/kernels/mma_probe.py,
#                                   # mmq_core.py) and the whole prefill: in_place alone at small chunks,
#                                   # every earlier schedule vs default
#   bash bench/gpu_gate.sh types    # every weight type's in-place gate/up, time per weight byte against
#                                   # IQ2_XS's (bench_types_cuda.py; TYPE_TOKENS, REPS); not part of `all`
#   bash bench/gpu_gate.sh streaming  # the streamed arms against the resident run (bench_streaming_cuda.py;
#                                   # ARMS, STREAM_TOKENS, REPS: default,head-0,head-predict,head-predict-96 at
#                                   # 254,1030,4096,8179 tokens, 5 reps); not part of `all`
#   bash bench/gpu_gate.sh llama [TGZ]  # the whole model beside llama.cpp (bench_whole_model.py): the
#                                   # qwen3-30b-a3b --mix Q4_K_M pack (LAYERS, default 48) made, llama.cpp's
#                                   # CUDA library built from TGZ (default: the first llama.cpp-*.tgz in
#                                   # ../shared/peers/, shared/peers/ or .peers/), ours resident and streamed
#                                   # and llama.cpp resident and with host experts (WHOLE_ARMS: --arms) at
#                                   # WHOLE_TOKENS (1030,2048,8192,32768), REPS (3); --resume: a second call on
#                                   # the same machine measures only what the first did not finish; not part
#                                   # of `all`
# Uses the installed PyCUDA (`pip install -e '.[cuda,test]'`). Where `import pycuda` fails it
# installs it from the package index, and only where no index answers from the wheels in
# ../shared/wheels/, shared/wheels/ or .whl/ (into /tmp/site). `pytest verify/` sizes its own
# workers and their threads (verify/gate.py; STRATA_PREFILL_WORKERS=N overrides). Logs go to $OUT
# (or ./gpu-logs); a short table prints last.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
LOG=${OUT:-gpu-logs}
if [[ $MODE == llama ]]; then  # the source tgz, found before any work
  TGZ=${2:-}
  if [[ -z $TGZ ]]; then
    for t in ../shared/peers/llama.cpp-*.tgz shared/peers/llama.cpp-*.tgz .peers/llama.cpp-*.tgz; do
      if [[ -f $t ]]; then TGZ=$t; break; fi
    done
  fi
  if [[ -z $TGZ ]]; then
    echo "gpu_gate: llama needs llama.cpp's source tgz: bash bench/gpu_gate.sh llama TGZ (none in" \
         "../shared/peers/, shared/peers/ or .peers/)" >&2
    exit 2
  elif [[ ! -f $TGZ ]]; then
    echo "gpu_gate: llama: $TGZ: no such file (a path from the repository root)" >&2
    exit 2
  fi
fi
mkdir -p "$LOG"
if ! python3 -c "import pycuda" 2>/dev/null; then
  if ! python3 -m pip install -q --retries 0 --timeout 15 'pycuda>=2026.1' 2>/dev/null; then
    WHEELS=""
    for d in ../shared/wheels shared/wheels .whl; do
      if compgen -G "$d/*.whl" > /dev/null; then WHEELS=$d; break; fi
    done
    if [[ -z $WHEELS ]]; then
      echo "gpu_gate: PyCUDA is not installed, no package index answers, and there are no wheels" \
           "in ../shared/wheels/, shared/wheels/ or .whl/" >&2
      exit 1
    fi
    echo "gpu_gate: installing PyCUDA from $WHEELS (no package index answers)"
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site
  fi
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
SUMMARY="$LOG/summary.txt"
: > "$SUMMARY"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$SUMMARY"

if [[ $MODE == verify || $MODE == all ]]; then
  python3 -m pytest verify/ -q -p no:cacheprovider 2>&1 | tee "$LOG/verify.log"
  { grep '^gate: ' "$LOG/verify.log"; echo "verify: $(tail -n 1 "$LOG/verify.log")"; } >> "$SUMMARY"
fi

if [[ $MODE == bench || $MODE == all ]]; then
  PACK=/tmp/strata8.gguf
  [[ -f $PACK ]] || python3 -m strata_prefill make-pack --preset strata --layers "${LAYERS:-8}" \
      --expert-type IQ2_XS --no-progress "$PACK" 2>&1 | tail -n 2
  python3 -m bench.bench_mmq_cuda 2>&1 | tee "$LOG/mmq.log" | tail -n 25 >> "$SUMMARY"
  python3 -m bench.bench_prefill_cuda --pack "$PACK" --tokens "${TOKENS:-2048,8192,32768}" 2>&1 \
      | tee "$LOG/prefill.log" | tail -n 5 >> "$SUMMARY"
  python3 -m bench.phase_floors --pack "$PACK" --tokens "${TOKENS:-2048,8192,32768}" --out "$LOG" 2>&1 \
      | tee "$LOG/phase_floors.log" | tail -n 11 >> "$SUMMARY"
  if python3 -c "import matplotlib" 2>/dev/null; then
    python3 -m bench.phase_floors --plot "$LOG/phase_floors.json" "$LOG/phase_floors.png" | tee -a "$SUMMARY"
  fi
  python3 -m strata_prefill run --pack "$PACK" --impl fast --prompt-tokens "${TRACE_TOKENS:-8192}" --greedy 0 \
      --no-progress --timing --trace "$LOG/trace.json" 2>&1 | tee "$LOG/timing.log" | tail -n 3 >> "$SUMMARY"
  if python3 -c "import matplotlib" 2>/dev/null; then
    python3 -m strata_prefill plot "$LOG/trace.json" "$LOG/trace-chunk0.png" | tee -a "$SUMMARY"
  fi
  # every expert resident: the gathers happen with in_place 0 only (group_gather does nothing otherwise)
  python3 -m strata_prefill bench --pack "$PACK" --a STRATA_PREFILL_GROUP_GATHER=0,STRATA_PREFILL_IN_PLACE=0 \
      --b STRATA_PREFILL_IN_PLACE=0 \
      --tokens "${TOKENS:-2048,8192,32768}" --reps "${REPS:-3}" --markdown "$LOG/ab_group.md" 2>&1 \
      | tee "$LOG/ab_group.log"; cat "$LOG/ab_group.md" >> "$SUMMARY"
  python3 -m strata_prefill bench --pack "$PACK" --a STRATA_QUANT_GATHER=1 --b STRATA_QUANT_GATHER=0 \
      --tokens "${TOKENS:-2048,8192,32768}" --reps "${REPS:-3}" --phases --markdown "$LOG/ab_quant.md" 2>&1 \
      | tee "$LOG/ab_quant.log"; cat "$LOG/ab_quant.md" >> "$SUMMARY"
fi
if [[ $MODE == kernels ]]; then
  PACK=/tmp/strata8.gguf
  [[ -f $PACK ]] || python3 -m strata_prefill make-pack --preset strata --layers "${LAYERS:-8}" \
      --expert-type IQ2_XS --no-progress "$PACK" 2>&1 | tail -n 2
  python3 -m bench.bench_attention_ab_cuda --sass "$LOG/sass" 2>&1 | tee "$LOG/attention_ab.log" | tail -n 6 >> "$SUMMARY"
  python3 -m bench.bench_float_dense_ab_cuda 2>&1 | tee "$LOG/float_dense_ab.log" | tail -n 12 >> "$SUMMARY"
  python3 -m bench.bench_dense_mmq_ab_cuda --configs \
      '{"MMQ_WM": 4, "MMQ_BN": 64, "MMQ_MINB": 2};{"MMQ_WM": 4, "MMQ_BN": 128, "MMQ_STAGES": 3, "MMQ_MINB": 2, "MMQ_MIX_MIN": 0}' 2>&1 | tee "$LOG/dense_mmq_ab.log" | tail -n 13 >> "$SUMMARY"
  python3 -m bench.bench_combine_ab_cuda 2>&1 | tee "$LOG/combine_ab.log" | tail -n 6 >> "$SUMMARY"
  python3 -m bench.bench_in_place_cuda --out "$LOG" 2>&1 | tee "$LOG/in_place.log" | tail -n 7 >> "$SUMMARY"
  python3 -m dev.kernels.mma_probe 2>&1 | tee "$LOG/dev_mma_probe.log" | tail -n 6 >> "$SUMMARY"
  python3 -m dev.kernels.mmq_core 2>&1 | tee "$LOG/dev_mmq_core.log" | tail -n 5 >> "$SUMMARY"
  python3 -m strata_prefill bench --pack "$PACK" --a STRATA_PREFILL_IN_PLACE=0 --b default \
      --tokens "${SMALL_TOKENS:-254,1024,2048}" --reps "${REPS:-5}" --markdown "$LOG/ab_in_place.md" 2>&1 \
      | tee "$LOG/ab_in_place.log"; cat "$LOG/ab_in_place.md" >> "$SUMMARY"
  python3 -m strata_prefill bench --pack "$PACK" \
      --a STRATA_PREFILL_IN_PLACE=0,STRATA_PREFILL_FUSE_GROUP=0,STRATA_PREFILL_OVERLAP_PLAN=0 \
      --b default --tokens "${TOKENS:-2048,8192,32768}" --reps "${REPS:-5}" --markdown "$LOG/ab_earlier.md" 2>&1 \
      | tee "$LOG/ab_earlier.log"; cat "$LOG/ab_earlier.md" >> "$SUMMARY"
fi
if [[ $MODE == streaming ]]; then
  PACK=/tmp/strata8.gguf
  [[ -f $PACK ]] || python3 -m strata_prefill make-pack --preset strata --layers "${LAYERS:-8}" \
      --expert-type IQ2_XS --no-progress "$PACK" 2>&1 | tail -n 2
  python3 -m bench.bench_streaming_cuda --pack "$PACK" --tokens "${STREAM_TOKENS:-254,1030,4096,8179}" \
      --reps "${REPS:-5}" --arms "${ARMS:-default,head-0,head-predict,head-predict-96}" \
      --out "$LOG/streaming.json" 2>&1 | tee "$LOG/streaming.log" | tail -n 12 >> "$SUMMARY"
fi
if [[ $MODE == types ]]; then
  python3 -m bench.bench_types_cuda --tokens "${TYPE_TOKENS:-1024,8192}" --reps "${REPS:-7}" --out "$LOG" 2>&1 \
      | tee "$LOG/types.log" | sed -n '/^| tokens/,$p' >> "$SUMMARY"
fi
if [[ $MODE == llama ]]; then
  python3 -m bench.bench_whole_model --llama-tgz "$TGZ" --layers "${LAYERS:-48}" \
      --tokens "${WHOLE_TOKENS:-1030,2048,8192,32768}" --reps "${REPS:-3}" ${WHOLE_ARMS:+--arms "$WHOLE_ARMS"} \
      --resume --out "$LOG" 2>&1 \
      | tee "$LOG/whole_model.log"
  cat "$LOG/whole_model.md" >> "$SUMMARY" 2>/dev/null || echo "llama: no table (see $LOG/whole_model.log)" >> "$SUMMARY"
fi
if [[ $MODE == suites ]]; then
  python3 -m pytest bench/ -q -p no:cacheprovider -k "not reference" --benchmark-storage "file://$PWD/$LOG/benchmarks" \
      --benchmark-autosave --benchmark-columns=median,rounds 2>&1 | tee "$LOG/suites.log"
  echo "suites: $(tail -n 1 "$LOG/suites.log")" >> "$SUMMARY"
fi
echo; echo "==== summary ===="; cat "$SUMMARY"
