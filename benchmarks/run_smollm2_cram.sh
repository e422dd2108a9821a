#!/usr/bin/env bash
# Issue 14: SmolLM2-135M accessibility curves at m = 1, 2, 3 for C_emp, on the CPU, resumable.
# The same budget for every m: at most 1000 Adam steps, lr 1e-2, 8 random-token targets per
# length, BOS before the memory vectors, float32 (settings hash 018d6dd96eb1c2cd). Each m writes
# into benchmarks/results/smollm2_cram/m<m>/ (cram.jsonl, one line per target; a rerun skips the
# targets already there, so an interrupted run resumes; cram_summary.json/.md; PNGs).
# The lengths bracket each n50 (m = 2: 16 is 8/8 and 32 is 0/8, so 48 is not run; m = 3: 44 is 1/8).
# Usage: benchmarks/run_smollm2_cram.sh [M ...]   (default: 2 3 1; one process per m can run
# side by side, each on one thread), e.g.
#   nohup benchmarks/run_smollm2_cram.sh 3 > runs/cram_m3.log 2>&1 &
# then: .venv/bin/python benchmarks/cram_slope.py benchmarks/results/smollm2_cram/m{1,2,3}
set -u
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
declare -A LENGTHS=([1]="12 16 8 20" [2]="16 24 32" [3]="36 28 44")
for m in "${@:-2 3 1}"; do
  # shellcheck disable=SC2086
  nice -n 10 .venv/bin/embgeom cram --model smollm2-135m --mem "$m" --lengths ${LENGTHS[$m]} \
    --n-targets 8 --steps 1000 --lr 1e-2 --out "benchmarks/results/smollm2_cram/m$m" --plot \
    --no-progress
done
