#!/usr/bin/env bash
# Runs one rlhfjax job on this machine with the allocator settings that suit JAX on CPU.
#   launch/local.sh configs/tldr_sim.py runs/quickstart [--config.sft.steps=1000 ...]
# Multi-host launchers (TPU pod slices, SLURM GPU clusters) build on the same entry point.
set -euo pipefail
config=${1:?usage: launch/local.sh CONFIG WORKDIR [--config.key=value ...]}
workdir=${2:?usage: launch/local.sh CONFIG WORKDIR [--config.key=value ...]}
shift 2
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-4294967296}
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-68719476736}
export MALLOC_TOP_PAD_=${MALLOC_TOP_PAD_:-1073741824}
exec python -m rlhfjax.main --config "$config" --workdir "$workdir" "$@"
