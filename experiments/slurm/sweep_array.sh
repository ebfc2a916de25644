#!/usr/bin/env bash
# A sweep split over a Slurm job array: each task runs one shard, then a last job merges them.
#   sbatch --array=1-8 experiments/slurm/sweep_array.sh experiments/configs/sparse_vs_dense.yaml
#   (after all tasks) build/bin/kvouter sweep-merge experiments/results/sweep_sparse_vs_dense.jsonl \
#       experiments/results/sweep_sparse_vs_dense.shard*-of-8.jsonl
#SBATCH --job-name=kvouter-sweep
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
set -euo pipefail
config=${1:?usage: sweep_array.sh CONFIG.yaml}
shards=${SLURM_ARRAY_TASK_COUNT:?run as a job array}
shard=${SLURM_ARRAY_TASK_ID:?run as a job array}
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/../..}"
exec build/bin/kvouter sweep "$config" --shard "$shard/$shards"
