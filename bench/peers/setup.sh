#!/bin/sh
# Creates the PyTorch side's own virtual environment (default .venv-peers at the repository root):
# the CPU build of torch 2.13.0 and transformers. Pin torch: an unpinned 'torch' from PyPI pulls
# several GB of CUDA packages.
set -e
VENV="${1:-.venv-peers}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "torch==2.13.0" transformers numpy
"$VENV/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
