#!/usr/bin/env bash
# GPU check of train-lora's preflight (components/common/preflight/) on one machine.
#
# Run from the repository root on a GPU machine (torch importable as python3, nothing to
# install):
#     bash benchmarks/preflight_gpu.sh                # every visible GPU
#     bash benchmarks/preflight_gpu.sh --device cpu   # the same cases on CPU (gloo, 2 processes)
#
# Cases (each prints a header, its output and its exit code; the script exits non-zero
# when a case does not behave as expected; about 1-2 minutes in all):
#   a. torchrun on all visible GPUs: table per GPU and per link, JSON figures; must pass.
#   b. (2+ GPUs) two "nodes" on this host: two `--launch` processes with a Vertex
#      CLUSTER_SPEC (node 0 and node 1, one GPU each, master 127.0.0.1); must pass.
#   c. simulated slow GPU (--expected-tflops far above the real figure): must fail with
#      PreflightFailed within its time bound; prints the seconds it took.
#   d. --expect-gpus one more than visible: must fail with PreflightFailed naming the count.
# Figures and logs go to $OUT (default /tmp/preflight-gpu).
set -u -o pipefail

PY=${PYTHON:-python3}
DEVICE=cuda
if [ "${1:-}" = "--device" ] && [ "${2:-}" = "cpu" ]; then DEVICE=cpu; fi
OUT=${OUT:-/tmp/preflight-gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast off (NVLS / symmetric memory): not available on every machine lent here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if [ "$DEVICE" = cuda ]; then
    NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
    if [ "$NGPU" -lt 1 ]; then echo "no GPU visible; use --device cpu" >&2; exit 2; fi
    NPROC=$NGPU
    VISIBLE=$NGPU
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, [torch.cuda.get_device_name(i) for i in range($NGPU)])"
    nvidia-smi --query-gpu=index,name,memory.used,memory.total,clocks.sm,temperature.gpu --format=csv || true
else
    NPROC=2
    VISIBLE=0
fi
PF=(-m components.common.preflight --device "$DEVICE")
FAILED=()

now() { date +%s.%N; }
elapsed() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }
header() { printf '\n========== %s ==========\n' "$1"; }
verdict() {  # name, ok (0/1), detail
    if [ "$2" -eq 0 ]; then echo "CASE $1: OK ($3)"; else echo "CASE $1: UNEXPECTED ($3)"; FAILED+=("$1"); fi
}

# a. torchrun on all visible GPUs ---------------------------------------------------------------
header "a. torchrun --nproc-per-node $NPROC (expect-gpus $VISIBLE): must pass"
t0=$(now)
timeout 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" "${PF[@]}" \
    --expect-gpus "$VISIBLE" --json "$OUT/a.json" 2>&1 | tee "$OUT/a.log"
code=${PIPESTATUS[0]}
echo "exit code $code, $(elapsed "$t0" "$(now)") s"
[ -f "$OUT/a.json" ] && "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d[k] for k in ('ok','metrics','problems','warnings') if k in d}, indent=1))" "$OUT/a.json"
verdict a "$([ "$code" -eq 0 ] && grep -q "preflight: PASSED" "$OUT/a.log"; echo $?)" "exit $code"

# b. two nodes on one host -----------------------------------------------------------------------
if [ "$NPROC" -ge 2 ]; then
    header "b. two nodes on one host (CLUSTER_SPEC, node 0 and node 1, one device each): must pass"
    PORT=$((29500 + RANDOM % 1000))
    CLUSTER='"cluster": {"workerpool0": ["127.0.0.1:'$PORT'"], "workerpool1": ["127.0.0.1:'$PORT'"]}'
    t0=$(now)
    for node in 0 1; do
        if [ "$node" = 0 ]; then task='{"type": "workerpool0", "index": 0}'; else task='{"type": "workerpool1", "index": 0}'; fi
        dev=$([ "$DEVICE" = cuda ] && echo "$node" || echo "")
        CUDA_VISIBLE_DEVICES=$dev CLUSTER_SPEC="{$CLUSTER, \"task\": $task}" timeout 150 "$PY" "${PF[@]}" --launch \
            --nproc 1 --expect-gpus "$([ "$DEVICE" = cuda ] && echo 1 || echo 0)" --timeout-s 60 \
            --json "$OUT/b$node.json" >"$OUT/b$node.log" 2>&1 &
        pids[node]=$!
    done
    wait "${pids[0]}"; code0=$?
    wait "${pids[1]}"; code1=$?
    echo "--- node 0 ---"; cat "$OUT/b0.log"
    echo "--- node 1 ---"; cat "$OUT/b1.log"
    echo "exit codes node 0: $code0, node 1: $code1, $(elapsed "$t0" "$(now)") s"
    verdict b "$([ "$code0" -eq 0 ] && [ "$code1" -eq 0 ] && grep -q "inter-node" "$OUT/b0.log"; echo $?)" \
        "exit $code0/$code1"
else
    header "b. two nodes on one host: skipped (one GPU)"
fi

# c. simulated slow GPU ---------------------------------------------------------------------------
WALL=90
header "c. --expected-tflops 100000 on $NPROC device(s): must fail with PreflightFailed within $WALL s"
t0=$(now)
timeout 150 "$PY" "${PF[@]}" --launch --nproc "$NPROC" --expected-tflops 100000 --timeout-s 30 --op-timeout-s 30 \
    --wall-s "$WALL" --json "$OUT/c.json" 2>&1 | tee "$OUT/c.log"
code=${PIPESTATUS[0]}
took=$(elapsed "$t0" "$(now)")
echo "exit code $code, $took s (bound $WALL s)"
verdict c "$([ "$code" -ne 0 ] && grep -q "PreflightFailed: preflight failed" "$OUT/c.log" \
    && grep -q ">= 50000.0 TFLOP/s" "$OUT/c.log" && "$PY" -c "import sys; sys.exit(float(sys.argv[1]) >= $WALL)" "$took"; echo $?)" \
    "exit $code, $took s"

# d. more GPUs expected than visible --------------------------------------------------------------
header "d. --expect-gpus $((VISIBLE + 1)) with $VISIBLE visible: must fail with PreflightFailed"
t0=$(now)
timeout 150 "$PY" "${PF[@]}" --launch --nproc "$NPROC" --expect-gpus $((VISIBLE + 1)) 2>&1 | tee "$OUT/d.log"
code=${PIPESTATUS[0]}
echo "exit code $code, $(elapsed "$t0" "$(now)") s"
verdict d "$([ "$code" -ne 0 ] && grep -q "visible GPU count $VISIBLE, expected $((VISIBLE + 1))" "$OUT/d.log"; echo $?)" \
    "exit $code"

header "summary"
if [ "${#FAILED[@]}" -eq 0 ]; then echo "all cases behaved as expected; figures in $OUT"; exit 0; fi
echo "cases that did not behave as expected: ${FAILED[*]}"
exit 1
