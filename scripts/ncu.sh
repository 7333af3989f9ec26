#!/usr/bin/env bash
# Nsight Compute on one of our kernels, with its SASS mapped to the .cu source.
#
#   scripts/ncu.sh [-k KERNEL_REGEX] [-o OUT] [-s SKIP] [--] COMMAND [ARGS...]
#
# Runs COMMAND under `ncu` and profiles one launch of the kernels whose name
# matches KERNEL_REGEX (default `tgpu_gemm`, the GEMM of the `gemm` benchmark) after
# skipping SKIP matching launches (default 1: the warm-up), with every section
# (`--set full`) and the source files imported into the report
# (`--import-source yes`), so the report opens anywhere with its source. Writes
# OUT.ncu-rep (default target/ncu/<regex>) and prints the hottest source lines
# of the CUDA view and where the SASS of our recorder's calls lands.
#
# Why it works: every kernel is compiled with `-lineinfo` by default
# (`KernelBuild::lineinfo`; `tracing-gpu demo --no-lineinfo` and the quickstart's and
# benchmarks' `--no-lineinfo` turn it off), so the PTX carries `.file`/`.loc` and the SASS
# keeps the line table. Our kernels are compiled at run time by NVRTC, under
# their bare file name (`gemm.cu`): `--source-folders` tells ncu where those
# names live (kernels/, kernels/include/ and tools/bench/kernels/ of this checkout).
#
# Examples (on the GPU machine; the binaries come from `cargo build --release
# --features full --bins` and `cargo build --release -p tracing-gpu-bench`):
#   scripts/ncu.sh -- target/release/gemm
#   scripts/ncu.sh -k 'regex:.' -s 0 -o target/ncu/demo -- target/release/tracing-gpu demo
# Open the report in the Nsight Compute UI (`ncu-ui OUT.ncu-rep`), page
# "Source", view "Source and SASS".
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kernel=tgpu_gemm
out=
skip=1
while [ $# -gt 0 ]; do
  case $1 in
    -k) kernel=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -s) skip=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "usage: $0 [-k KERNEL_REGEX] [-o OUT] [-s SKIP] [--] COMMAND [ARGS...]" >&2
  exit 2
fi
if ! command -v ncu >/dev/null; then
  echo "ncu (Nsight Compute) is not on the PATH: it comes with the CUDA toolkit" >&2
  exit 3
fi
case $kernel in regex:*) ;; *) kernel="regex:$kernel" ;; esac
out=${out:-$top/target/ncu/$(echo "${kernel#regex:}" | tr -c 'A-Za-z0-9_\n' _)}
mkdir -p "$(dirname "$out")"

args=(--set full --import-source yes --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 -f -o "$out")
# Older ncu releases lack --source-folders; then the sources must be found at
# the paths the line table gives (run from kernels/).
if ncu --help 2>/dev/null | grep -q -- '--source-folders'; then
  args+=(--source-folders "$top/kernels,$top/kernels/include,$top/tools/bench/kernels")
fi
echo "+ ncu ${args[*]} $*" >&2
ncu "${args[@]}" "$@"

rep=$out.ncu-rep
echo "report: $rep" >&2
if ncu --help 2>/dev/null | grep -q -- '--print-source'; then
  # The CUDA source view of the report, as CSV: one row per source line with
  # its metrics. A kernel without line info has only SASS here.
  src=$out.source.csv
  ncu --import "$rep" --page source --print-source cuda --csv > "$src" || true
  lines=$(grep -c . "$src" || true)
  echo "CUDA source view: $lines rows in $src" >&2
  if grep -q 'tgpu::' "$src" 2>/dev/null; then
    echo "the recorder's calls (tgpu::) appear in the source view:" >&2
    grep -n 'tgpu::' "$src" | head -20 >&2
  fi
  ncu --import "$rep" --page source --print-source cuda,sass --csv > "$out.source-sass.csv" || true
  echo "CUDA lines with their SASS: $out.source-sass.csv" >&2
fi
