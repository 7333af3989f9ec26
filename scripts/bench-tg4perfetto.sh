#!/usr/bin/env bash
# The Perfetto writer benchmark with the tg4perfetto comparison (a benchmark,
# not a CI test): installs protoc (tg4perfetto's sdist needs it to build) and
# tg4perfetto into the test venv, then runs `cargo bench --bench perfetto`.
# Figures go to docs/performance.md, "## Perfetto writer".
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/test-env.sh)"
if ! command -v protoc >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq protobuf-compiler >&2
  else
    echo "bench-tg4perfetto: protoc is missing (apt-get install protobuf-compiler)" >&2
    exit 1
  fi
fi
"$TGPU_PYTHON" -c 'import tg4perfetto' 2>/dev/null || "$(dirname "$TGPU_PYTHON")/pip" install -q tg4perfetto >&2
exec cargo bench --bench perfetto "$@"
