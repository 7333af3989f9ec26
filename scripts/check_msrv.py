#!/usr/bin/env python3
"""What can be checked of the MSRV without its toolchain (run by scripts/test.sh).

Only one Rust toolchain is installed where the tests run, and none can be fetched,
so no build with the declared rust-version happens. This checks what can be
checked honestly: every crate the library compiles (normal and build
dependencies, every feature, on this host's target) declares a `rust_version`
no newer than the library's. Clippy's `incompatible_msrv` lint (denied in
test.sh) covers the library's own calls into std.

    cargo metadata --locked --all-features --format-version 1 \
        --filter-platform "$(rustc -vV | sed -n 's/host: //p')" | scripts/check_msrv.py [--allow CRATE ...]
    scripts/check_msrv.py --self-test

--allow names a crate known to need more (printed each run, never silent).
Standard library only.
"""

import argparse
import json
import sys

PACKAGE = "tracing-gpu"


def version(s):
    parts = [int(p) for p in s.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def too_new(meta, package=PACKAGE):
    """(msrv, [(crate, version, its rust_version, path from the package)])."""
    pkgs = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(i for i, p in pkgs.items() if p["name"] == package and p["source"] is None)
    msrv = pkgs[root]["rust_version"]
    seen, stack = {root: [package]}, [root]
    while stack:
        i = stack.pop()
        for d in nodes[i]["deps"]:
            kinds = {k["kind"] for k in d["dep_kinds"]}
            if kinds == {"dev"}:
                continue
            if d["pkg"] not in seen:
                seen[d["pkg"]] = seen[i] + [pkgs[d["pkg"]]["name"]]
                stack.append(d["pkg"])
    out = []
    for i, path in sorted(seen.items(), key=lambda x: pkgs[x[0]]["name"]):
        rv = pkgs[i].get("rust_version")
        if i != root and rv and version(rv) > version(msrv):
            out.append((pkgs[i]["name"], pkgs[i]["version"], rv, " <- ".join(reversed(path))))
    return msrv, out


def report(meta, allow, out=sys.stdout, err=sys.stderr):
    msrv, over = too_new(meta)
    bad = [o for o in over if o[0] not in allow]
    for name, ver, rv, path in over:
        word = "allowed" if name in allow else "FAILED"
        print(f"msrv: {word}: {name} {ver} needs Rust {rv} > {msrv} ({path})", file=err)
    if bad:
        return 1
    print(f"msrv: every dependency the library compiles declares Rust <= {msrv}"
          + (f", but {len(over)} allowed above it" if over else ""), file=out)
    return 0


def self_test():
    def pkg(name, rv, source="registry"):
        return {"id": name, "name": name, "version": "1.0.0", "rust_version": rv, "source": source}

    def dep(name, kind=None):
        return {"pkg": name, "dep_kinds": [{"kind": kind}]}

    meta = {
        "packages": [pkg(PACKAGE, "1.85", None), pkg("a", "1.80"), pkg("b", "1.88"),
                     pkg("c", None), pkg("devonly", "1.90"), pkg("deep", "1.86")],
        "resolve": {"nodes": [
            {"id": PACKAGE, "deps": [dep("a"), dep("b"), dep("devonly", "dev"), dep("c", "build")]},
            {"id": "a", "deps": [dep("deep")]}, {"id": "b", "deps": []}, {"id": "c", "deps": []},
            {"id": "devonly", "deps": []}, {"id": "deep", "deps": []},
        ]},
    }
    failed = 0
    _, over = too_new(meta)
    got = [(o[0], o[3]) for o in over]
    want = [("b", "b <- tracing-gpu"), ("deep", "deep <- a <- tracing-gpu")]
    if got != want:
        print(f"msrv self-test FAILED: want {want}, got {got}", file=sys.stderr)
        failed += 1
    class Null:
        def write(self, _):
            pass
    for allow, rc in [((), 1), (("b",), 1), (("b", "deep"), 0)]:
        if report(meta, allow, out=Null(), err=Null()) != rc:
            print(f"msrv self-test FAILED: --allow {allow}: want exit {rc}", file=sys.stderr)
            failed += 1
    if failed:
        return 1
    print("msrv self-test: 4 cases passed")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allow", nargs="*", default=[], help="crates known to need a newer Rust")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    return report(json.load(sys.stdin), set(args.allow))


if __name__ == "__main__":
    sys.exit(main())
