#!/usr/bin/env python3
"""Prints the device slices of a tracing-gpu Perfetto trace, one per line:

    SM<TAB>block<TAB>warp<TAB>name<TAB>start_ns<TAB>end_ns

read with Perfetto's own `perfetto_trace_pb2` through tests/check_perfetto.py's
reader (sequences, interning, incremental clocks resolved to BOOTTIME). Used by
tests/otlp_perfetto.rs to compare OTLP span times with the Perfetto trace's.
Exit status 2 when `perfetto` cannot be imported.
"""
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_perfetto as cp  # noqa: E402  (exits 2 itself without `perfetto`)

SLICE_BEGIN, SLICE_END, INSTANT = cp.SLICE_BEGIN, cp.SLICE_END, cp.INSTANT
WARP = re.compile(r"^block (\d+) warp (\d+)(?: #\d+)?$")
SM = re.compile(r"^SM (\d+)$")


def main(path):
    c = cp.Checker(0)
    with open(path, "rb") as f:
        c.read(f.read())
    per_track = defaultdict(list)
    for e in c.events:
        per_track[e[2]].append(e)
    for uuid, evs in per_track.items():
        d = c.tracks.get(uuid)
        w = WARP.match(c.name_of(d)) if d is not None else None
        if not w:
            continue
        parent = c.tracks.get(d.parent_uuid)
        sm = SM.match(c.name_of(parent)) if parent is not None else None
        if not sm:
            continue
        evs.sort(key=lambda e: (e[0], e[1]))
        stack = []
        for ts, _order, _, typ, name, *_ in evs:
            if typ == SLICE_BEGIN:
                stack.append((ts, name))
            elif typ == SLICE_END and stack:
                start, name = stack.pop()
                print(f"{sm.group(1)}\t{w.group(1)}\t{w.group(2)}\t{name}\t{start}\t{ts}")
            elif typ == INSTANT:
                print(f"{sm.group(1)}\t{w.group(1)}\t{w.group(2)}\t{name}\t{ts}\t{ts}")


if __name__ == "__main__":
    main(sys.argv[1])
