#!/usr/bin/env bash
# The SASS the GPU machine runs, made here without a GPU: NVRTC 13.0 (the GPU machine's
# libnvrtc) makes the PTX with the options `KernelBuild` gives (sm_90, -std=c++17,
# -lineinfo), and ptxas 13.0 (the driver's JIT of CUDA 13.0) assembles it.
#
#   tools/bench/scripts/device-sass.sh OUT KERNEL.cu HEADER_DIR [-DNAME=VALUE...]
#
# Writes OUT.ptx, OUT.cubin and OUT.sass (cuobjdump -sass), and prints each kernel's
# registers. HEADER_DIR holds the `tracing_gpu.cuh` to include (kernels/include for the
# shipped one, or a folder with a variant); without defines the build is the gate off's,
# `-DTGPU_ENABLED=1` the recorder's. The first run downloads the two CUDA 13.0 wheels
# into target/cuda-13.0 (about 70 MB; scripts/test-env.sh's Python for pip).
#
# Why not the wheels' 13.5 (scripts/test-env.sh): their PTX differs, and so does the
# SASS. On `decode_step`'s attention (issue #28) nvcc 13.5 kept 3 loads in flight in the
# value loop where the device's SASS (ncu's source view) waited for each one; this
# pipeline gave the device's SASS instruction for instruction, for the gate off, the
# shipped header and the header of 3ac8c84 (lab history, session 21).
set -euo pipefail
fail() { echo "device-sass.sh: $*" >&2; exit 2; }
[ $# -ge 3 ] || fail "usage: $0 OUT KERNEL.cu HEADER_DIR [-DNAME=VALUE...]"
out=$1 src=$2 inc=$3
shift 3
[ -f "$src" ] || fail "$src: no such file"
[ -f "$inc/tracing_gpu.cuh" ] || fail "$inc has no tracing_gpu.cuh"
top=$(cd "$(dirname "$0")/../../.." && pwd)
cuda=$top/target/cuda-13.0
bin=$cuda/nvidia/cu13/bin lib=$cuda/nvidia/cu13/lib
# cuobjdump and pip: scripts/test-env.sh's (TGPU_CUDA_HOME, TGPU_PYTHON), else its defaults.
python=${TGPU_PYTHON:-$top/target/pyenv/bin/python}
cuobjdump=${TGPU_CUDA_HOME:+$TGPU_CUDA_HOME/bin/cuobjdump}
cuobjdump=${cuobjdump:-$(ls "$top"/target/pyenv/lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump 2>/dev/null | head -1)}
[ -x "$cuobjdump" ] || fail "no cuobjdump from the CUDA wheels: run scripts/test-env.sh first"
installed() { [ -x "$bin/ptxas" ] && [ -e "$lib/libnvrtc.so.13" ]; }
if ! installed; then
  [ -x "$python" ] || fail "no $python: run scripts/test-env.sh first"
  # The tests run this script in parallel: the first to get the lock installs, and the
  # others wait for it and find the folder there (CI once failed on two pips sharing
  # one temporary folder). Installed whole into a fresh folder, then moved, so that the
  # folder is complete or absent. Both the wait and the install are bounded.
  mkdir -p "$(dirname "$cuda")"
  exec 9>"$cuda.lock"
  flock -w 600 9 || fail "waited 600 s for another run's install of the CUDA 13.0 wheels"
  if ! installed; then
    rm -rf "$cuda.tmp"
    timeout 600 "$python" -m pip install -q --no-deps --target "$cuda.tmp" \
      nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvcc==13.0.88 || fail "could not install the CUDA 13.0 wheels"
    chmod +x "$cuda.tmp"/nvidia/cu13/bin/*
    rm -rf "$cuda" && mv "$cuda.tmp" "$cuda"
  fi
  exec 9>&-
fi

LD_LIBRARY_PATH=$lib python3 - "$src" "$out.ptx" "$inc" "$lib/libnvrtc.so.13" "$@" <<'EOF'
import ctypes, sys
src, ptx_path, inc, libpath = sys.argv[1:5]
lib = ctypes.CDLL(libpath)
prog = ctypes.c_void_p()
name = src.rsplit("/", 1)[-1].encode()
if lib.nvrtcCreateProgram(ctypes.byref(prog), open(src, "rb").read(), name, 0, None, None):
    sys.exit("device-sass.sh: nvrtcCreateProgram failed")
opts = [b"--gpu-architecture=compute_90", b"-I" + inc.encode(), b"-std=c++17", b"-lineinfo"]
opts += [a.encode() for a in sys.argv[5:]]
status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
size = ctypes.c_size_t()
if status:
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    sys.exit("device-sass.sh: NVRTC 13.0 failed:\n" + log.value.decode(errors="replace"))
lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
ptx = ctypes.create_string_buffer(size.value)
lib.nvrtcGetPTX(prog, ptx)
open(ptx_path, "wb").write(ptx.value)
EOF
"$bin/ptxas" -arch=sm_90 -O3 -o "$out.cubin" "$out.ptx" || fail "ptxas 13.0 failed on $out.ptx"
"$cuobjdump" -sass "$out.cubin" > "$out.sass"
"$cuobjdump" -res-usage "$out.cubin" | awk '/Function/ { name = $2 } /REG:/ { print name, $1, $2 }'
