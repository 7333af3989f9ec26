#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every check
# CI runs, on the library and on the benchmarks (tools/bench). GPU tests skip (and say
# so) where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/test-env.sh)"
cargo fmt --all -- --check
scripts/check-layout.sh --self-test
scripts/check-layout.sh
cargo clippy --workspace --all-targets --all-features -- -D warnings
cargo test --workspace --all-features
cargo test --no-default-features --lib
# The API docs as docs.rs builds them (every feature), broken links refused.
RUSTDOCFLAGS="-D warnings" cargo doc --all-features --no-deps
