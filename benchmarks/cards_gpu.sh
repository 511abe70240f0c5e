#!/usr/bin/env bash
# Issue 53's GPU runs on one H200 (the cards users rent, stood in for by memory caps), in calls back to back while
# the machine stays warm: each phase installs the wheels its call carries (benchmarks/gpu_wheels.sh; bitsandbytes
# split out of .whl_u1 into .whl_bnb so that each call carries at most 64 MiB) into /tmp/site or /tmp/usite.
#
#   phase tests  (carry .whl_bnb [.whl_u1]): bitsandbytes [and Unsloth's needs]; every GPU test file, on the stack
#                                          in /tmp/site (a call before installed the swift wheels there)
#   phase prep   (carry .whl_bnb .whl_u1): bitsandbytes and Unsloth's needs only (then peer carries .whl_u2 alone)
#   phase ours   (carry .whl .whl_hf):     ms-swift, the lock's transformers; the 4B built; our runs
#   phase peer   (carry .whl_u1 .whl_u2):  Unsloth; Unsloth's runs and ours again, in one random order
#
#   bash benchmarks/cards_gpu.sh PHASE "PROFILE ..." "UNSLOTH-RUN ..."   (writes $OUT/PHASE.log, RESULT lines)
# An Unsloth run is `4bit|bf16:BATCH:GC[:CAP]` (GC false | true | unsloth). A profile with `@capLEAN` runs after the
# others, under a cap 6 % + 0.2 GiB above the lowest measured peak of this call's `b1_` runs (the smallest card that
# plan needs: the planner's 4 % margin and some room; must-show 2's "auto under a cap just above our leanest peak").
set -uo pipefail
phase=$1
ours=${2:-}
peers=${3:-}
steps=${STEPS:-10}
model=${MODEL:-4b}  # 4b, or 8b / 32b (benchmarks/qwen3_vl_large.py builds those; `ours` runs only)
install() {  # install TARGET DIR...: one pip call (a second --target --upgrade call replaces TARGET/bin, swift's)
    local target=$1
    shift
    local wheels=()
    for dir in "$@"; do wheels+=("$dir"/*.whl); done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "${wheels[@]}"
}
case "$phase" in
    tests) install /tmp/site .whl_bnb && { [ ! -d .whl_u1 ] || install /tmp/usite .whl_u1; } ;;
    prep) install /tmp/site .whl_bnb && install /tmp/usite .whl_u1 ;;  # a fresh machine: bnb, Unsloth's needs
    ours) [ -x /tmp/site/bin/swift ] || install /tmp/site .whl .whl_hf ;;
    peer) [ -d /tmp/usite/unsloth ] || { [ -d .whl_u1 ] && install /tmp/usite .whl_u1 .whl_u2 || install /tmp/usite .whl_u2; } ;;
esac
[ "$phase" = prep ] && exit 0
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
log=$OUT/$phase.log
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee -a "$log"
python3 -c 'import torch, transformers, peft; print("versions", torch.__version__, transformers.__version__, peft.__version__)' | tee -a "$log"
if [ "$phase" = tests ]; then
    mapfile -t files < <(grep -l "cuda.is_available" tests/test_*.py speedups/tests/test_*.py)
    echo "GPU test files: ${files[*]}" | tee -a "$log"
    python3 -m pytest -o addopts= -q -p no:cacheprovider -rs "${files[@]}" tests/test_partial_checkpointing.py 2>&1 \
        | tail -25 | tee -a "$log"
    exit 0
fi
if [ "$model" = 4b ]; then
    mdir=/tmp/m/model tp=/tmp/tp
    [ -f $mdir/config.json ] || python3 -m benchmarks.qwen3_vl_4b $mdir > /dev/null
else
    mdir=/tmp/m_$model/model tp=/tmp/tp_$model
    # the 32B's random bf16 weights (66.7 GB) exceed the GPU machine's 64 GiB disk; its /dev/shm holds 128 GiB
    [ "$model" = 32b ] && mdir=/dev/shm/m_$model/model
    [ -n "$peers" ] && { echo "MODEL=$model: Unsloth runs only with the 4b" | tee -a "$log"; exit 2; }
    [ -f $mdir/config.json ] || python3 -m benchmarks.qwen3_vl_large "$model" $mdir | tee -a "$log"
fi
runs=()
for p in $ours; do runs+=("ours:$p"); done
for p in $peers; do runs+=("peer:$p"); done
mapfile -t order < <(printf '%s\n' "${runs[@]}" | grep -v capLEAN | shuf; printf '%s\n' "${runs[@]}" | grep capLEAN)
lean=""
echo "model: $model order: ${order[*]}" | tee -a "$log"
train=$tp/train-$((16 * steps + 8))-1024px-mp1048576
for run in "${order[@]}"; do
    kind=${run%%:*}
    spec=${run#*:}
    start=$(date +%s)
    if [ "$kind" = ours ] && [[ "$spec" == *capLEAN* ]]; then
        [ -z "$lean" ] && { echo "[$run] skipped: no b1_ run measured a peak before it" | tee -a "$log"; continue; }
        spec=${spec//capLEAN/cap$lean}
        run="ours:$spec"
    fi
    if [ "$kind" = ours ]; then
        python3 -m benchmarks.train_throughput --model $mdir --out $tp --steps "$steps" \
            --n-train $((16 * steps + 8)) --profiles "$spec" > "$OUT/run.log" 2>&1
    else
        IFS=: read -r prec batch gc cap <<< "$spec"
        flags=(--model $mdir --train "$train" --steps "$steps" --batch "$batch" --gc "$gc")
        [ "$prec" = 4bit ] && flags+=(--load-in-4bit)
        [ -n "${cap:-}" ] && flags+=(--cap-gib "$cap")
        PYTHONPATH=/tmp/usite:/tmp/site:$PWD python3 -m benchmarks.unsloth_peer "${flags[@]}" > "$OUT/run.log" 2>&1
    fi
    rc=$?
    if [ "$kind" = ours ] && [[ "$spec" == b1_* ]]; then
        lean=$(python3 -c 'import json, sys
rows = [json.loads(l[7:]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
peak = rows[-1].get("peak_memory_gib") if rows else None
caps = [float(c) for c in sys.argv[2:] if c] + ([peak * 1.06 + 0.2] if peak else [])
print(f"{min(caps):.1f}" if caps else "")' "$OUT/run.log" "$lean")
    fi
    grep -E "^RESULT" "$OUT/run.log" | sed "s/^/[$run] /" >> "$log"  # whole: benchmarks/results_json.py reads them
    grep -E "plan:|speed-ups:|gradient checkpointing on|out of memory|Error" "$OUT/run.log" | cut -c1-600 \
        | sed "s/^/[$run] /" | tee -a "$log"
    echo "[$run] rc=$rc wall=$(( $(date +%s) - start ))s" | tee -a "$log"
    [ $rc -ne 0 ] && tail -20 "$OUT/run.log" | sed "s/^/[$run] /" >> "$log"
done
exit 0
