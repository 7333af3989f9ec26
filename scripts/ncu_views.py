#!/usr/bin/env python3
"""Reads the source views that scripts/ncu.sh exports from an Nsight Compute report.

  ncu_views.py summary OUT        what OUT.cuda.csv and OUT.cuda-sass.csv hold (exit 6 if
                                  the kernel has no line info)
  ncu_views.py maps OUT NAME      exit 0 if the source-and-SASS view has lines of a file
                                  named NAME with metrics
  ncu_views.py same-sass A B      exit 0 if A.sass.csv and B.sass.csv list the same
                                  instructions (addresses taken relative to the first)
  ncu_views.py --self-test        checks the readers on rows cut from real ncu exports

The formats, as ncu 2025.3 writes them with --csv:
  --print-source cuda       "File Name","PATH", then "Line No","Source" and a row per
                            line; without line info only a ==WARNING== line.
  --print-source sass       "Kernel Name","K", then "Address","Source",<metrics...> and
                            a row per instruction.
  --print-source cuda,sass  per source file: "File Path","PATH", "Function Name","K",
                            a header, then each line ("Line No","Source","-","-",
                            <the line's metrics>) followed by its instructions
                            ("","",ADDRESS,SASS,<metrics>).
Standard library only.
"""

import csv
import re
import sys


def rows(path):
    with open(path, newline="", errors="replace") as f:
        return [r for r in csv.reader(f) if r]


def numbered(row):
    return len(row) >= 2 and row[0].strip().isdigit()


def has_metrics(row):
    """A line row with a metric above zero (instructions executed, samples, ...)."""
    for cell in row[4:]:
        try:
            if float(cell.replace(",", "")) > 0:
                return True
        except ValueError:
            pass
    return False


def files(out):
    """{path: (line rows, line rows with metrics)} from OUT.cuda-sass.csv."""
    found, path = {}, None
    for r in rows(f"{out}.cuda-sass.csv"):
        if r[0] == "File Path" and len(r) > 1:
            path = r[1]
            found.setdefault(path, [0, 0])
        elif path is not None and numbered(r):
            found[path][0] += 1
            found[path][1] += has_metrics(r)
    return found


def summary(out):
    lines = [r for r in rows(f"{out}.cuda.csv") if numbered(r)]
    if not lines:
        print(f"ncu.sh: the kernel has no line info (compiled without -lineinfo?): "
              f"its CUDA source view is empty ({out}.cuda.csv)", file=sys.stderr)
        return 6
    sass = sum(1 for r in rows(f"{out}.sass.csv") if r[0].startswith("0x"))
    print(f"CUDA source view: {len(lines)} lines ({out}.cuda.csv); "
          f"SASS view: {sass} instructions ({out}.sass.csv)", file=sys.stderr)
    print(f"source and SASS ({out}.cuda-sass.csv), lines with SASS / with metrics:",
          file=sys.stderr)
    for path, (n, hot) in sorted(files(out).items()):
        mark = "   <- the recorder" if path.endswith("tracing_gpu.cuh") else ""
        print(f"  {path}: {n} / {hot}{mark}", file=sys.stderr)
    return 0


def maps(out, name):
    found = {p: c for p, c in files(out).items() if p.endswith("/" + name) or p == name}
    n = sum(c[0] for c in found.values())
    hot = sum(c[1] for c in found.values())
    print(f"  {out}.cuda-sass.csv: {n} lines of {name} with SASS, {hot} with metrics")
    return 0 if hot > 0 else 1


HEX = re.compile(r"0x[0-9a-fA-F]{6,}")


def code(path):
    instructions = [r for r in rows(path) if r[0].startswith("0x") and len(r) > 1]
    if not instructions:
        return []
    base = int(instructions[0][0], 16)

    def relative(m):
        v = int(m.group(), 16)
        return f"+{v - base:#x}" if v >= base else m.group()

    return [(f"{int(r[0], 16) - base:#x}", HEX.sub(relative, r[1])) for r in instructions]


def same_sass(a, b):
    ca, cb = code(f"{a}.sass.csv"), code(f"{b}.sass.csv")
    diff = next((i for i, (x, y) in enumerate(zip(ca, cb)) if x != y), None)
    print(f"  {len(ca)} and {len(cb)} instructions"
          + (f"; first difference at {ca[diff]} / {cb[diff]}" if diff is not None else ""))
    return 0 if ca and ca == cb else 1


def self_test():
    import contextlib
    import io
    import os
    import tempfile

    head = '"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)","# Samples","Instructions Executed"\n'
    views = {
        "on.cuda.csv": '"File Name","/w/scale.cu"\n"Line No","Source"\n"1","#include ""tracing_gpu.cuh"""\n"2","TGPU_EVENT(Scale, 1);"\n',
        "on.sass.csv": '"Kernel Name","scale",\n"Address","Source","# Samples"\n"0x7f86b97b0200","      IMAD.MOV.U32 R12, RZ, RZ, RZ","0"\n"0x7f86b97b0210","      BRA 0x7f86b97b0200","1"\n',
        "on.cuda-sass.csv": '"File Path","/tmp/tracing-gpu-include-1/tracing_gpu.cuh"\n"Function Name","scale"\n' + head
        + '"388","asm volatile(""mov.u32 %0, %%smid;"" : ""=r""(s));","-","-","3","3","65536"\n'
        + '"","","0x7f86b97b0d10","@P0   S2R R3, SR_VIRTUALSMID","1","1","32768"\n'
        + '"File Path","/w/scale.cu"\n"Function Name","scale"\n' + head
        + '"9","}","-","-","0","0","0"\n"","","...","...","-","-","-"\n',
        "off.cuda.csv": "==WARNING== No lineinfo available to show CUDA-C source related to 'scale'.\n",
        "off.sass.csv": '"Kernel Name","scale",\n"Address","Source","# Samples"\n"0x7f3f8b7b0000","      IMAD.MOV.U32 R12, RZ, RZ, RZ","4"\n"0x7f3f8b7b0010","      BRA 0x7f3f8b7b0000","0"\n',
        "other.sass.csv": '"Kernel Name","scale",\n"Address","Source","# Samples"\n"0x7f3f8b7b0000","      IMAD.MOV.U32 R12, RZ, RZ, RZ","4"\n"0x7f3f8b7b0010","      BRA 0x7f3f8b7b0010","0"\n',
    }
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        for name, text in views.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        on, off, other = (os.path.join(d, n) for n in ("on", "off", "other"))
        cases = [
            ("a view with lines", lambda: summary(on), 0),
            ("a view without line info", lambda: summary(off), 6),
            ("the recorder's lines with metrics", lambda: maps(on, "tracing_gpu.cuh"), 0),
            ("a file whose lines have no metrics", lambda: maps(on, "scale.cu"), 1),
            ("a file the view does not hold", lambda: maps(on, "gemm.cu"), 1),
            ("the same SASS at another address", lambda: same_sass(on, off), 0),
            ("another branch target", lambda: same_sass(on, other), 1),
        ]
        for what, run, want in cases:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                got = run()
            if got != want:
                print(f"self-test: {what}: exit {got}, expected {want}", file=sys.stderr)
                failures += 1
    print(f"ncu_views.py self-test: {len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    commands = {"summary": (summary, 1), "maps": (maps, 2), "same-sass": (same_sass, 2)}
    if len(argv) < 2 or argv[1] not in commands or len(argv) != 2 + commands[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    f, _ = commands[argv[1]]
    return f(*argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
