#!/usr/bin/env bash
# The source-mapping check to run on a GPU machine before a release: scripts/ncu.sh
# on the GEMM, the quickstart kernel and a kernel in a user's own folder must give a
# CUDA source view with rows for the kernel's file and for tracing_gpu.cuh (the
# recorder's calls), with metrics; the quickstart built with --no-lineinfo must fail
# with "no line info" and have the same SASS; the user's kernel without its folder
# must fail with "could not import".
#
#   scripts/ncu-check.sh BIN_DIR [OUT_DIR]
#
# BIN_DIR holds `gemm` and `user_kernel` (cargo build --release -p tracing-gpu-bench)
# and `quickstart` (cargo build --release --features cuda --example quickstart).
# OUT_DIR (default target/ncu-check) receives the reports and views. Prints one line
# per check and ends with "N passed, M failed"; exits non-zero if any failed.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "${1:?usage: $0 BIN_DIR [OUT_DIR]}" && pwd)
out=${2:-$top/target/ncu-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
passed=0 failed=0
check() {  # description, then a command that succeeds when the check holds
  local what=$1; shift
  if "$@"; then echo "ok: $what"; passed=$((passed + 1)); else echo "FAILED: $what"; failed=$((failed + 1)); fi
}

# A user's project: the README's kernel in a folder of its own, outside this checkout.
user=$(mktemp -d /tmp/tgpu-user-XXXXXX)
trap 'rm -rf "$user"' EXIT
cat > "$user/scale.cu" <<'CU'
#include "tracing_gpu.cuh"
TGPU_EVENT(Scale, 1);
extern "C" __global__ void scale(float* x, float a, unsigned n TGPU_TRACE_PARAM) {
    TGPU_RECORDER(rec, Scale);
    rec.begin<Scale>();
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
    rec.end<Scale>();
}
CU

ncu_run() {  # name, expected status, ncu.sh arguments...
  local name=$1 want=$2; shift 2
  local got=0
  "$top/scripts/ncu.sh" -o "$out/$name" "$@" > "$out/$name.stdout" 2> "$out/$name.stderr" || got=$?
  sed 's/^/  /' "$out/$name.stderr" | grep -vE '^  (==PROF==|\+ ncu)' | tail -n 8
  [ "$got" -eq "$want" ] || { echo "  $name: exit $got, expected $want"; return 1; }
}
# The source-and-SASS view has lines of FILE with metrics.
maps_to() { python3 "$top/scripts/ncu_views.py" maps "$out/$1" "$2"; }
# The two reports' SASS views list the same instructions.
same_sass() { python3 "$top/scripts/ncu_views.py" same-sass "$out/$1" "$out/$2"; }

check "gemm: ncu.sh succeeds" ncu_run gemm 0 -k tgpu_gemm -s 1 -- "$bin/gemm" --size 2048 2048 2048 --reps 3 --variants phases
check "gemm: source view maps gemm.cu" maps_to gemm gemm.cu
check "gemm: source view maps tracing_gpu.cuh" maps_to gemm tracing_gpu.cuh
check "quickstart: ncu.sh succeeds" ncu_run quickstart 0 -k tiled_poly -s 0 -- "$bin/quickstart" "$out/q.perfetto-trace" --launches 2
check "quickstart: source view maps quickstart.cu" maps_to quickstart quickstart.cu
check "quickstart: source view maps tracing_gpu.cuh" maps_to quickstart tracing_gpu.cuh
check "quickstart --no-lineinfo: fails with 'no line info' (exit 6)" ncu_run quickstart-nolineinfo 6 -k tiled_poly -s 0 -- "$bin/quickstart" "$out/q.perfetto-trace" --launches 2 --no-lineinfo
check "quickstart: the same SASS with and without line info" same_sass quickstart quickstart-nolineinfo
check "user's folder: ncu.sh -S succeeds" ncu_run user 0 -k scale -s 0 -S "$user" -- "$bin/user_kernel" "$user/scale.cu"
check "user's folder: source view maps scale.cu" maps_to user scale.cu
check "user's folder: source view maps tracing_gpu.cuh" maps_to user tracing_gpu.cuh
check "user's folder without -S: fails with 'could not import' (exit 5)" ncu_run user-nofolder 5 -k scale -s 0 -- "$bin/user_kernel" "$user/scale.cu"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
