#!/usr/bin/env bash
# Nsight Compute on a kernel, with its SASS mapped to the .cu source, or a clear failure.
#
#   scripts/ncu.sh [-k KERNEL_REGEX] [-s SKIP] [-o OUT] [-S DIR]... [--] COMMAND [ARGS...]
#
# Runs COMMAND under `ncu` and profiles one launch of the kernels whose name matches
# KERNEL_REGEX (default `tgpu_gemm`, the GEMM of the `gemm` benchmark) after skipping
# SKIP matching launches (default 1: the warm-up), with every section (`--set full`)
# and the source files imported into the report (`--import-source yes`), so that it
# opens anywhere with its source. Writes:
#   OUT.ncu-rep          the report (default OUT: target/ncu/<regex>)
#   OUT.log              what ncu and COMMAND printed
#   OUT.cuda.csv         the CUDA source view: the kernel's file, a row per line
#   OUT.sass.csv         the SASS view: a row per instruction, with its metrics
#   OUT.cuda-sass.csv    each source file (the kernel's, tracing_gpu.cuh, ...) with
#                        its lines, their metrics and their SASS
# and prints, per source file, how many lines have SASS and how many have metrics
# (scripts/ncu_views.py reads the views).
#
# NVRTC names a kernel's file by the program name given to `KernelBuild::new`
# (`gemm.cu`, `scale.cu`), so ncu must be told where such names live: this
# checkout's kernels/, kernels/include/ (tracing_gpu.cuh) and tools/bench/kernels/
# always, and each folder given with -S (your own kernels' folders).
#
# Fails, with one line on stderr, when:
#   2  the command line is wrong;
#   3  ncu is missing, or too old for --source-folders and --print-source (2023.1+);
#   4  ncu or COMMAND failed, or no kernel matched;
#   5  ncu could not import a source file (give its folder with -S);
#   6  the profiled kernel has no line info (compiled without -lineinfo): its CUDA
#      source view is empty.
#
# Examples (on the GPU machine; binaries from `cargo build --release -p tracing-gpu-bench`
# and `cargo build --release --features cuda --example quickstart`):
#   scripts/ncu.sh -- target/release/gemm --size 2048 2048 2048 --reps 3 --variants phases
#   scripts/ncu.sh -k tiled_poly -s 0 -- target/release/examples/quickstart /tmp/q.perfetto-trace
#   scripts/ncu.sh -k scale -s 0 -S ~/proj/kernels -- ~/proj/target/release/myapp
# Open the report in the Nsight Compute UI (`ncu-ui OUT.ncu-rep`), page "Source",
# view "Source and SASS".
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kernel=tgpu_gemm
out=
skip=1
folders=("$top/kernels" "$top/kernels/include" "$top/tools/bench/kernels")
fail() { echo "ncu.sh: $2" >&2; exit "$1"; }
while [ $# -gt 0 ]; do
  case $1 in
    -k|-o|-s|-S) [ $# -ge 2 ] || fail 2 "$1 needs a value" ;;&
    -k) kernel=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -s) skip=$2; shift 2 ;;
    -S) [ -d "$2" ] || fail 2 "-S $2: not a folder"
        folders+=("$(cd "$2" && pwd)"); shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    -*) fail 2 "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || fail 2 "usage: $0 [-k KERNEL_REGEX] [-s SKIP] [-o OUT] [-S DIR]... [--] COMMAND [ARGS...]"
[[ $skip =~ ^[0-9]+$ ]] || fail 2 "-s $skip: not a count"
command -v ncu >/dev/null || fail 3 "ncu (Nsight Compute) is not on the PATH: it comes with the CUDA toolkit"

# Read the help once into a variable: `ncu --help | grep -q` under pipefail fails when
# grep closes the pipe early and ncu dies of SIGPIPE, which made these checks false.
help=$(ncu --help 2>&1 || true)
version=$(ncu --version 2>/dev/null | tail -n 1 || true)
for option in --source-folders --print-source --import-source; do
  grep -q -- "$option" <<<"$help" ||
    fail 3 "ncu ($version) has no $option: source mapping needs Nsight Compute 2023.1 or later"
done

case $kernel in regex:*) ;; *) kernel="regex:$kernel" ;; esac
out=${out:-$top/target/ncu/$(echo "${kernel#regex:}" | tr -c 'A-Za-z0-9_\n' _)}
mkdir -p "$(dirname "$out")"
rep=$out.ncu-rep log=$out.log
rm -f "$rep" "$log" "$out".{cuda,sass,cuda-sass}.csv
source_folders=$(IFS=,; echo "${folders[*]}")

args=(--set full --import-source yes --source-folders "$source_folders"
      --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 -f -o "$out")
echo "+ ncu ${args[*]} $*" >&2
echo "$version" >&2
set +e
ncu "${args[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] || fail 4 "ncu exited with status $status (see $log)"
[ -s "$rep" ] || fail 4 "no kernel matched $kernel: no report written (see $log)"
# ncu says so, and goes on, when the line table names a file it cannot find.
if grep -q 'Failed to import' "$log"; then
  missing=$(grep -A20 'Failed to import' "$log" | grep -oE '[^ ]+\.(cu|cuh|h|hpp|c|cpp)' | sort -u | tr '\n' ' ')
  fail 5 "ncu could not import source file(s) ${missing:-(see $log)}: give their folder with -S DIR"
fi

export_view() {  # view file
  ncu --import "$rep" --page source --print-source "$1" --csv > "$2" 2>>"$log" ||
    fail 4 "ncu --print-source $1 failed (see $log)"
}
export_view cuda "$out.cuda.csv"
export_view sass "$out.sass.csv"
export_view cuda,sass "$out.cuda-sass.csv"

python3 "$top/scripts/ncu_views.py" summary "$out" || exit $?
echo "report: $rep" >&2
