#!/usr/bin/env bash
# Builds the README's first Rust example as a user would: a crate of its own whose
# Cargo.toml holds the README's ```toml block (tracing-gpu taken from this checkout),
# checked offline with the dependencies already fetched. A doctest cannot see a
# missing feature (it builds with the crate's dev-dependencies); this can.
#   scripts/check-readme-build.sh          (run by scripts/test.sh)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
crate=$top/target/readme-example
rm -rf "$crate/src" && mkdir -p "$crate/src"
python3 - "$top/README.md" "$crate" "$top" <<'PY'
import re, sys
readme, crate, top = sys.argv[1:]
text = open(readme).read()
toml = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
rust = re.search(r"```rust,no_run\n(.*?)```", text, re.S).group(1)
if not re.search(r'^tracing-gpu = ', toml, re.M):
    sys.exit("README's ```toml block names no tracing-gpu dependency")
toml = re.sub(r'^tracing-gpu = \{ version = "[^"]*"', f'tracing-gpu = {{ path = "{top}"', toml, flags=re.M)
open(f"{crate}/Cargo.toml", "w").write(
    '[package]\nname = "readme-example"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
    + "[workspace]\n\n" + toml)
open(f"{crate}/src/main.rs", "w").write(rust)
PY
# Its own lock file, resolved offline from what the workspace's build fetched; the
# workspace's target/ shares the compiled dependencies.
cd "$crate"
CARGO_TARGET_DIR=$top/target cargo check --offline --quiet
echo "README example: builds as a crate of its own with the README's Cargo.toml lines"
