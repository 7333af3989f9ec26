#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every check
# CI runs, on the library and on the benchmarks (tools/bench). GPU tests skip (and say
# so) where there is no GPU. Every cargo command is --locked: CI builds what
# Cargo.lock (and fuzz/Cargo.lock) say, never a fresh resolution.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/test-env.sh)"
# One clean pass: incremental state would add gigabytes to target/ (CI's disk is
# small and shared) and buys nothing on a build that runs once.
export CARGO_INCREMENTAL=0

# The most public items rustdoc may list (target/doc/tracing_gpu/all.html);
# lower it when the API shrinks, raise it only on purpose.
# 109: TracedKernel and its TracedLaunch (a launch that records nothing runs the
# production kernel), capture::MAX_NAME_LEN (the names a capture may hold), on purpose.
# 112: sampling (issue #31): format::Sampling (what the argument, the buffer and every
# output say was sampled), cuda::Sampler (which launches: a predicate and one in n, a
# count shared by its clones) and cuda::Sampled (a launch with its own sampler, as
# Streaming is a streamed one), on purpose.
MAX_PUBLIC_ITEMS=112
# The reference of what it costs stays a reference; the history goes to docs/lab/.
MAX_PERFORMANCE_LINES=250

cargo fmt --all -- --check
python3 scripts/check_api.py --self-test
python3 scripts/check_msrv.py --self-test
python3 scripts/ncu_views.py --self-test
scripts/check-layout.sh --self-test
scripts/check-layout.sh
lines=$(wc -l < docs/performance.md)
if [ "$lines" -gt "$MAX_PERFORMANCE_LINES" ]; then
  echo "docs/performance.md has $lines lines (limit $MAX_PERFORMANCE_LINES): move history to docs/lab/" >&2
  exit 1
fi

# MSRV: no toolchain of the declared rust-version runs here (CONTRIBUTING.md), so
# what can be checked is: no dependency the library compiles declares a newer one,
# and clippy's incompatible_msrv (below) refuses std items newer than it.
cargo metadata --locked --all-features --format-version 1 \
  --filter-platform "$(rustc -vV | sed -n 's/^host: //p')" |
  python3 scripts/check_msrv.py

# Each feature alone, and all of them, as a user would build them.
cargo check --locked --no-default-features --lib
cargo check --locked --no-default-features --features cuda --lib --examples
cargo check --locked --no-default-features --features otlp --lib --examples
cargo check --locked --no-default-features --features cli --lib --bins
cargo check --locked --features full --lib --bins
# The fuzz targets: their own workspace and lock file, checked on stable (fuzzing
# itself needs nightly: fuzz/README.md); the root's target/ shares the dependencies.
(cd fuzz && CARGO_TARGET_DIR=../target cargo check --locked --bins)

# What the published package holds, and what it must not.
package=$(cargo package --list --locked --allow-dirty 2>/dev/null)
for must in src/lib.rs kernels/include/tracing_gpu.cuh examples/quickstart.rs \
  captures/h200-quickstart.tgpu README.md LICENSE-MIT LICENSE-APACHE CHANGELOG.md Cargo.lock; do
  grep -qxF "$must" <<<"$package" || { echo "package: $must is missing" >&2; exit 1; }
done
if grep -E '^(target|\.ci|scripts|tools|fuzz|docs/lab)/' <<<"$package" >&2; then
  echo "package: the files above are for development only" >&2
  exit 1
fi

cargo clippy --locked --workspace --all-targets --all-features -- -D warnings -D clippy::incompatible_msrv
# The real backends the OTLP tests export to (tests/jaeger.rs, tests/collector.rs): Jaeger
# and an OpenTelemetry Collector, built once into a cache outside the repository (about
# 8 minutes the first time on 2 cores: 453 s from empty caches). Without Go this fails, on CI as anywhere;
# TGPU_NO_BACKENDS=1 skips those tests instead, saying so.
TGPU_BACKENDS=$(scripts/backends.sh)
export TGPU_BACKENDS
cargo test --locked --workspace --all-features
cargo test --locked --no-default-features --lib
# Every Rust block of README.md and docs/*.md as a user builds it: a crate per ```toml
# block, with exactly those lines.
scripts/check-doc-builds.sh
# The API docs as docs.rs builds them (every feature), broken links refused.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --all-features --no-deps
python3 scripts/check_api.py --max "$MAX_PUBLIC_ITEMS" target/doc/tracing_gpu/all.html
