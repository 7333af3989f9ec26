#!/usr/bin/env bash
# Builds every Rust block of README.md and docs/*.md as a user would: each ```toml block
# and the Rust blocks after it (up to the next ```toml) become one crate of their own,
# whose Cargo.toml holds exactly those lines (tracing-gpu taken from this checkout), each
# block a function or a module of it, checked offline with the dependencies already
# fetched. A doctest cannot see a missing feature or dependency (it builds with the
# crate's dev-dependencies); this can. A Rust block with no ```toml block before it in
# its file is an error: its dependencies must be shown.
#   scripts/check-doc-builds.sh          (run by scripts/test.sh)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/target/doc-builds
rm -rf "$out" && mkdir -p "$out"
crates=$(python3 - "$top" "$out" <<'PY'
import glob, os, re, sys
top, out = sys.argv[1:]
fence = re.compile(r"^```([^\n`]*)\n(.*?)^```$", re.S | re.M)

def unhide(code):
    # rustdoc's hidden lines: "# code" and a lone "#".
    lines = []
    for line in code.splitlines():
        s = line.lstrip()
        if s == "#":
            continue
        if s.startswith("# "):
            line = line.replace("# ", "", 1)
        lines.append(line)
    return "\n".join(lines)

def wrap(i, code):
    # A block with items of its own (a `fn main`, a helper) becomes a module; one
    # of statements becomes a closure, whose tail (`Ok::<(), E>(())`) types its `?`.
    if re.search(r"^(pub )?fn ", code, re.M):
        return f"#[allow(unused)]\nmod block_{i} {{\n{code}\n}}\n"
    return f"#[allow(unused)]\nfn block_{i}() {{\n    let _ = (|| {{\n{code}\n    }})();\n}}\n"

crates = []
for path in ["README.md"] + sorted(glob.glob(os.path.join(top, "docs", "*.md"))):
    rel = os.path.relpath(os.path.join(top, path), top)
    text = open(os.path.join(top, rel)).read()
    groups, toml = [], None
    for m in fence.finditer(text):
        lang, body = m.group(1).strip(), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        if lang == "toml":
            toml = body
            groups.append((line, toml, []))
        elif lang.split(",")[0] == "rust":
            if "ignore" in lang.split(","):
                sys.exit(f"{rel}:{line}: a Rust block marked ignore is built by nothing")
            if toml is None:
                sys.exit(f"{rel}:{line}: a Rust block with no ```toml block before it")
            groups[-1][2].append(unhide(body))
    for line, toml, blocks in groups:
        if not blocks:
            continue
        if not re.search(r"^tracing-gpu = ", toml, re.M):
            sys.exit(f"{rel}:{line}: the ```toml block names no tracing-gpu dependency")
        toml = re.sub(r'^tracing-gpu = "([^"]*)"', r'tracing-gpu = { version = "\1" }', toml, flags=re.M)
        toml = re.sub(r'^tracing-gpu = \{ version = "[^"]*"', f'tracing-gpu = {{ path = "{top}"', toml, flags=re.M)
        name = re.sub(r"[^a-z0-9]+", "-", rel.lower().removesuffix(".md")) + f"-{line}"
        crate = os.path.join(out, name)
        os.makedirs(os.path.join(crate, "src"))
        open(os.path.join(crate, "Cargo.toml"), "w").write(
            f'[package]\nname = "doc-{name}"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
            + "[workspace]\n\n" + toml)
        main = "".join(wrap(i, b) for i, b in enumerate(blocks)) + "\nfn main() {}\n"
        open(os.path.join(crate, "src", "main.rs"), "w").write(main)
        crates.append(f"{crate} {rel}:{line} ({len(blocks)} blocks)")
print("\n".join(crates))
PY
)
# Each crate starts from the workspace's lock file (resolved offline from what its build
# fetched), so that it shares the workspace's versions and target/.
while read -r crate what; do
  cp "$top/Cargo.lock" "$crate/"
  (cd "$crate" && CARGO_TARGET_DIR=$top/target cargo check --offline --quiet) ||
    { echo "doc builds: $what does not build with its Cargo.toml lines ($crate)" >&2; exit 1; }
  echo "doc builds: $what builds with its Cargo.toml lines"
done <<<"$crates"
