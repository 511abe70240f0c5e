#!/usr/bin/env bash
# One profile of benchmarks/train_throughput.py under two trees of this project in one call, in random order with
# repeats (a change that must not cost speed: issue 52's "auto bf16 within 2 % of 0.889 s/step, before and after"),
# then the GPU test files. On the GPU machine, carrying .whl .whl_hf (benchmarks/gpu_wheels.sh swift) and the older
# tree, e.g. `mkdir .before && git archive 3bad39a | tar -x -C .before` (ignored by git, named in carry):
#
#   REPEATS=2 bash benchmarks/before_after_gpu.sh .before auto_liger_log5    # writes $OUT/before_after.log
#
# Each run has its own --out (a second run of one profile in one folder would find the first one's adapter); all
# read the rows the first run wrote (kept as /tmp/tph/<the rows folder name>, which names their count). RESULT lines
# carry [before:i] / [after:i] prefixes for benchmarks/results_json.py.
set -uo pipefail
before=$(cd "$1" && pwd)
profile=$2
repeats=${REPEATS:-2}
steps=${STEPS:-10}
[ -x /tmp/site/bin/swift ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl .whl_hf/*.whl
export PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
log=$OUT/before_after.log
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee -a "$log"
PYTHONPATH=/tmp/site:$PWD python3 -c 'import torch, transformers, peft; print("versions", torch.__version__,
transformers.__version__, peft.__version__)' | tee -a "$log"
mdir=/tmp/m/model
[ -f $mdir/config.json ] || PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.qwen3_vl_4b $mdir > /dev/null
train=train-$((16 * steps + 8))-1024px-mp1048576
call=$(date +%s)
runs=()
for i in $(seq "$repeats"); do runs+=("before:$i" "after:$i"); done
mapfile -t order < <(printf '%s\n' "${runs[@]}" | shuf)
echo "profile: $profile order: ${order[*]}" | tee -a "$log"
for run in "${order[@]}"; do
    tree=$PWD
    [ "${run%%:*}" = before ] && tree=$before
    out=/tmp/tph/$call/${run/:/_}  # this call's own: a folder of an earlier call holds its adapter
    mkdir -p "$out"
    [ -d /tmp/tph/$train ] && ln -sfn /tmp/tph/$train "$out/$train"
    start=$(date +%s)
    (cd "$tree" && PYTHONPATH=/tmp/site:$tree python3 -m benchmarks.train_throughput --model $mdir --out "$out" \
        --steps "$steps" --n-train $((16 * steps + 8)) --profiles "$profile") > "$OUT/run.log" 2>&1
    rc=$?
    [ -d /tmp/tph/$train ] || { [ -d "$out/$train" ] && mv "$out/$train" /tmp/tph/$train && ln -s /tmp/tph/$train "$out/$train"; }
    grep -E "^RESULT" "$OUT/run.log" | sed "s/^/[$run] /" >> "$log"
    grep -E "plan:|out of memory|Error" "$OUT/run.log" | cut -c1-400 | sed "s/^/[$run] /" | tee -a "$log"
    echo "[$run] rc=$rc wall=$(( $(date +%s) - start ))s" | tee -a "$log"
    [ $rc -ne 0 ] && tail -20 "$OUT/run.log" | sed "s/^/[$run] /" >> "$log"
done
python3 - "$log" <<'EOF' | tee -a "$log"
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if "] RESULT " in line:
        tag, _, body = line.partition("] RESULT ")
        rows.setdefault(tag.strip("[").split(":")[0], []).append(json.loads(body)["seconds_per_step"])
for tree, values in sorted(rows.items()):
    spread = max(values) - min(values)
    print(f"{tree}: s/step {' '.join(f'{v:.3f}' for v in values)}; mean {statistics.mean(values):.3f}, spread {spread:.3f}")
EOF
[ -n "${GPU_TESTS:-}" ] && PYTHONPATH=/tmp/site:$PWD python3 -m pytest -o addopts= -q -p no:cacheprovider $GPU_TESTS 2>&1 \
    | tail -15 | tee -a "$log"
exit 0
