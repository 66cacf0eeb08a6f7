#!/usr/bin/env bash
# The whole parity matrix (scenarios/parity) on the NCCL backend, one process with one rank per
# visible GPU, against the CPU reference; each rank computes on its GPU (--compute cuda, the nccl
# default). Configurations needing more ranks than GPUs are reported "not run". Skipped (exit 77,
# ctest SKIP_RETURN_CODE) with fewer than two GPUs: one GPU is covered by the other gpu_tests.
# Usage: nccl_matrix.sh SHARDCHECK SOURCE_DIR OUT_DIR
set -uo pipefail
shardcheck=$1 root=$2 out=$3
gpus=0
if command -v nvidia-smi >/dev/null; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
if [ "${gpus:-0}" -lt 2 ]; then
  echo "SKIP: the NCCL parity matrix needs two or more GPUs; $gpus visible here"
  exit 77
fi
rm -rf "$out" && mkdir -p "$out"
exec "$shardcheck" matrix "$root/scenarios/parity" --backend nccl --report "$out"
