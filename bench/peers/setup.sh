#!/bin/sh
# Creates the PyTorch side's own virtual environment (default .venv-peers at the repository root):
# the CPU build of torch 2.13.0, transformers, and TRL (its RLOO trainer is the `rloo` work's
# peer). Pin torch: an unpinned 'torch' from PyPI pulls several GB of CUDA packages.
set -e
VENV="${1:-.venv-peers}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "torch==2.13.0" transformers numpy
"$VENV/bin/pip" install -q "trl==1.16.0"
"$VENV/bin/python" -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
