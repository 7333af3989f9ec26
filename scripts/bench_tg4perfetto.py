#!/usr/bin/env python3
"""Writes the events of a tracing-gpu capture (wire format v1) with tg4perfetto,
the way FlashInfer's profiler does (a group per block, a group per warp, a
track per event type, `open` / `close` per event), and times it.

    bench_tg4perfetto.py CAPTURE OUT.perfetto-trace [--no-payload]

With `--no-payload`, events carry no argument (the seed's shape); otherwise
each carries its payload as a `payload` argument.

Prints `events=N decode_s=S write_s=S bytes=N` on one line. Times are CPU
seconds of this process. Only `write_s`
(tg4perfetto's work: track creation, packets, flushes, file close) is the
figure compared; the Python decode is timed apart. Used by
`cargo bench --bench perfetto` (benches/perfetto.rs); not a test.
"""

import struct
import sys
import time


def decode(buf):
    """Yields (block, warp, event_id, start, end, payload) per record."""
    (magic, version, hsize, shsize, rsize, cap, nslots, wpb) = struct.unpack_from("<IHHHHIII", buf, 0)
    if magic != 0x55504754 or version != 1:
        raise SystemExit("not a v1 tracing-gpu capture")
    stride = shsize + cap * rsize
    events = []
    for slot in range(nslots):
        at = hsize + slot * stride
        smagic, _flags, first, _last = struct.unpack_from("<IIQQ", buf, at)
        if smagic == 0:
            continue
        block, = struct.unpack_from("<I", buf, at + 32)
        warp, = struct.unpack_from("<I", buf, at + 48)
        count, = struct.unpack_from("<I", buf, at + 56)
        prev = first
        for end_lo, dur, eid, kind, payload in struct.iter_unpack(
            "<IIHHI", buf[at + shsize: at + shsize + count * rsize]
        ):
            end = prev + ((end_lo - (prev & 0xFFFFFFFF)) & 0xFFFFFFFF)
            prev = end
            events.append((block, warp, eid, end - dur, end, payload, kind))
    return events


def main():
    args = sys.argv[1:]
    with_payload = "--no-payload" not in args
    args = [a for a in args if a != "--no-payload"]
    if len(args) != 2:
        sys.stderr.write(__doc__)
        return 2
    try:
        from tg4perfetto import TraceGenerator
    except ImportError as e:
        sys.stderr.write(f"tg4perfetto is not installed here ({e}); see scripts/bench-tg4perfetto.sh\n")
        return 2
    buf = open(args[0], "rb").read()
    t0 = time.process_time()
    events = decode(buf)
    t1 = time.process_time()
    names = {1: "load", 2: "mma"}
    tgen = TraceGenerator(args[1])
    blocks, warps, tracks = {}, {}, {}
    for block, warp, eid, start, end, payload, kind in events:
        key = (block, warp, eid)
        track = tracks.get(key)
        if track is None:
            group = blocks.get(block)
            if group is None:
                group = blocks[block] = tgen.create_group(f"block_{block}")
            wg = warps.get((block, warp))
            if wg is None:
                wg = warps[(block, warp)] = group.create_group(f"warp_{warp}")
            track = tracks[key] = wg.create_track()
        name = names.get(eid, f"event {eid}")
        arg = {"payload": payload} if with_payload else None
        if kind == 1:
            track.instant(start, name, arg)
        else:
            track.open(start, name, arg)
            track.close(end)
    # tg4perfetto flushes and closes its file when the generator is freed
    # (its tracks hold it too).
    del tracks, warps, blocks, track, tgen
    t2 = time.process_time()
    size = len(open(args[1], "rb").read())
    print(f"events={len(events)} decode_s={t1 - t0:.3f} write_s={t2 - t1:.3f} bytes={size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
