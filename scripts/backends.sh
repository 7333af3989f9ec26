#!/usr/bin/env bash
# Builds the real OTLP backends the tests export to (tests/jaeger.rs,
# tests/collector.rs), once, into a cache outside the repository:
#   Jaeger v1.75.0 (cmd/jaeger: all-in-one, OTLP in, in-memory storage, query API)
#   an OpenTelemetry Collector v0.161.0 (OTLP receiver, file exporter)
# from the Go modules in tools/backends/ (go.mod and go.sum pin every module), through
# the Go module proxy. Prints the folder that holds `jaeger` and `otelcol`.
#
# The folder is named for a hash of those modules and of `go version`, so a change to
# either builds anew, and a second run costs a hash. Several runs at once (test binaries
# started together) build once: the build holds a lock.
#
# Without Go this fails: the tests need the backends, and CI must stay as strict as a
# developer's machine. TGPU_NO_BACKENDS=1 says to go without them: it prints nothing,
# and the backend tests skip, saying so.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

if [ "${TGPU_NO_BACKENDS:-}" = 1 ]; then
  echo "backends: TGPU_NO_BACKENDS=1: not built; the Jaeger and Collector tests skip" >&2
  exit 0
fi
if ! command -v go >/dev/null; then
  echo "backends: no Go toolchain (\`go\`) on PATH: Jaeger and the Collector cannot be built." >&2
  echo "backends: install Go >= 1.26 (its module proxy must be reachable), or set TGPU_NO_BACKENDS=1 to skip their tests" >&2
  exit 1
fi

# Go's own toolchain selection would download another Go: the one on PATH builds.
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -mod=readonly"
key=$( (go version; cd "$root/tools/backends" && find . -type f | LC_ALL=C sort | xargs sha256sum) |
  sha256sum | cut -c1-16)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/tracing-gpu/backends"
out="$cache/$key"
mkdir -p "$cache"

exec 9>"$cache/.lock"
flock 9
if [ ! -x "$out/jaeger" ] || [ ! -x "$out/otelcol" ]; then
  echo "backends: building Jaeger and the Collector into $out (once; about 8 minutes on 2 cores)" >&2
  start=$(date +%s)
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  # Go's build cache (some 2 GB for these two) is worth nothing once the binaries
  # exist, and disks here are small: a private one, removed after the build.
  GOCACHE=$(mktemp -d "$cache/.gocache.XXXXXX")
  export GOCACHE
  trap 'rm -rf "$tmp" "$GOCACHE"' EXIT
  (cd "$root/tools/backends/jaeger" &&
    go build -o "$tmp/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger)
  (cd "$root/tools/backends/collector" && go build -o "$tmp/otelcol" .)
  rm -rf "$out"
  mv "$tmp" "$out"
  rm -rf "$GOCACHE"
  trap - EXIT
  echo "backends: built in $(($(date +%s) - start)) s" >&2
fi
echo "$out"
