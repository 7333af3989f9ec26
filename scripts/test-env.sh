#!/usr/bin/env bash
# Installs what the tests need besides cargo, idempotently, and prints the
# environment to use them:  eval "$(scripts/test-env.sh)"
#   - a Python venv with Perfetto's protobuf schema (perfetto_trace_pb2) and tg4perfetto;
#   - the CUDA compilers from PyPI (NVRTC, nvcc, ptxas, cuobjdump, nvdisasm): no GPU needed.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
venv=${TGPU_VENV:-$top/target/pyenv}
stamp=$venv/.installed-v1
if [ ! -f "$stamp" ]; then
  {
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -r "$top/scripts/requirements-test.txt"
    touch "$stamp"
  } >&2
fi
cu=$("$venv/bin/python" -c 'import nvidia.cu13, os; print(os.path.dirname(nvidia.cu13.__file__))' 2>/dev/null || true)
if [ -z "$cu" ]; then
  cu=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 | head -1)
fi
echo "export TGPU_PYTHON='$venv/bin/python'"
echo "export TGPU_CUDA_HOME='$cu'"
echo "export PATH='$cu/bin':\"\$PATH\""
echo "export LD_LIBRARY_PATH='$cu/lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export TGPU_REQUIRE_TOOLS=1"
