#!/usr/bin/env bash
# The scaling curve (tests/bench/bench_scaling.py) on the accelerator machine (16 cores, one GPU):
# real CPU-bound envs, CartPole-v1 vector envs and ALE Pong (when the atari extra is installed),
# each against a CUDA learner (policy.cuda=True), collector workers 1 2 4 8 16. Raw JSON and the
# markdown tables go to $OUT (scaling-cartpole.json/.md, scaling-pong.json/.md, machine.txt).
#
#     OUT=/some/folder bash tests/bench/device_scaling.sh     # from the repository root
#
# Refuses (exit 2, one line why) without CUDA or without $OUT. Each curve is bounded by env
# steps per worker and by a timeout (seconds: SCALING_CARTPOLE_S, SCALING_PONG_S), so what ran
# comes back even when a curve is cut short; the exit code is the first curve's that failed.
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
if [ -z "${OUT:-}" ]; then echo "device_scaling: set OUT to the folder for the raw output" >&2; exit 2; fi
mkdir -p "$OUT"
reason=$("$PY" -c "from tests.bench.bench_cuda import no_cuda_reason as r; print(r() or '')") || exit 2
if [ -n "$reason" ]; then echo "device_scaling: refusing: $reason" >&2; exit 2; fi
{ nproc; free -g; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; } > "$OUT/machine.txt"
code=0
timeout "${SCALING_CARTPOLE_S:-240}" "$PY" -m tests.bench.bench_scaling --env cartpole --workers 1 2 4 8 16 \
    --steps-per-worker 20000 --set policy.cuda=True \
    --json "$OUT/scaling-cartpole.json" --markdown "$OUT/scaling-cartpole.md" > "$OUT/scaling-cartpole.log" 2>&1 || code=$?
if "$PY" -c "import ale_py" 2>/dev/null; then
    # Pong's games outlast a point's env steps: the rate is the learner's consumed env steps.
    timeout "${SCALING_PONG_S:-300}" "$PY" -m tests.bench.bench_scaling --env pong --workers 1 2 4 8 16 \
        --steps-per-worker 6000 --rate-from learner --set policy.cuda=True \
        --json "$OUT/scaling-pong.json" --markdown "$OUT/scaling-pong.md" > "$OUT/scaling-pong.log" 2>&1 \
        || { rc=$?; [ "$code" = 0 ] && code=$rc; }
else
    echo "device_scaling: ale_py is not installed (pip install 'rqrl[atari]'): Pong skipped" | tee "$OUT/scaling-pong.log" >&2
fi
tail -n 12 "$OUT"/scaling-*.md 2>/dev/null
exit "$code"
