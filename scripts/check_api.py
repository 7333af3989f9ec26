#!/usr/bin/env python3
"""Counts the crate's public items and fails above a limit (run by scripts/test.sh).

The count is rustdoc's item list, target/doc/tracing_gpu/all.html, as
`cargo doc --all-features --no-deps` writes it: every entry of its lists of
structs, enums, traits, macros, functions, constants, ... (`<ul class="all-items">`),
not the section headers or the sidebar's links to them. Standard library only.

    scripts/check_api.py --max N [ALL_HTML]   print the count; exit 1 above N
    scripts/check_api.py --self-test          check the counter on a small page
"""

import argparse
import os
import sys
from html.parser import HTMLParser


class _Items(HTMLParser):
    """Collects the links inside `<ul class="all-items">`, by the section before it."""

    def __init__(self):
        super().__init__()
        self.items = []  # (section, item name)
        self._section = "?"
        self._depth = 0  # nesting of <ul> inside an all-items list
        self._in_link = False
        self._text = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "h3" and a.get("id"):
            self._section = a["id"]
        elif tag == "ul":
            if self._depth or "all-items" in (a.get("class") or "").split():
                self._depth += 1
        elif tag == "a" and self._depth and a.get("href"):
            self._in_link, self._text = True, []

    def handle_endtag(self, tag):
        if tag == "ul" and self._depth:
            self._depth -= 1
        elif tag == "a" and self._in_link:
            self._in_link = False
            self.items.append((self._section, "".join(self._text).strip()))

    def handle_data(self, data):
        if self._in_link:
            self._text.append(data)


def count(html):
    """The public items an all.html lists: [(section, name)]."""
    p = _Items()
    p.feed(html)
    p.close()
    return p.items


def self_test():
    page = (
        '<nav class="sidebar"><ul><li><a href="#structs" title="Structs">Structs</a></li>'
        '<li><a href="#macros">Macros</a></li></ul></nav>'
        '<h1>List of all items</h1>'
        '<h3 id="structs">Structs</h3><ul class="all-items">'
        '<li><a href="a/struct.A.html">a::A</a></li><li><a href="b/struct.B.html">b::B</a></li></ul>'
        '<h3 id="macros">Macros</h3><ul class="all-items"><li><a href="macro.m.html">m</a></li></ul>'
        '<h3 id="constants">Constants</h3><ul class="all-items"></ul>'
    )
    want = [("structs", "a::A"), ("structs", "b::B"), ("macros", "m")]
    got = count(page)
    if got != want:
        print(f"api self-test FAILED: want {want!r}, got {got!r}", file=sys.stderr)
        return 1
    print("api self-test: 1 case passed")
    return 0


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "target", "doc", "tracing_gpu", "all.html")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("all_html", nargs="?", default=default, help="rustdoc's all.html")
    ap.add_argument("--max", type=int, help="the most public items allowed")
    ap.add_argument("--self-test", action="store_true", help="check the counter")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.max is None:
        ap.error("--max is required")
    try:
        with open(args.all_html, encoding="utf-8") as fh:
            items = count(fh.read())
    except OSError as e:
        print(f"api: cannot read {args.all_html} ({e}); run cargo doc first", file=sys.stderr)
        return 2
    by = {}
    for section, _ in items:
        by[section] = by.get(section, 0) + 1
    detail = ", ".join(f"{n} {s}" for s, n in sorted(by.items(), key=lambda x: -x[1]))
    if not items:
        print(f"api: no items found in {args.all_html}: has rustdoc's page changed?", file=sys.stderr)
        return 1
    if len(items) > args.max:
        print(f"api: {len(items)} public items ({detail}), over the limit of {args.max}", file=sys.stderr)
        return 1
    print(f"api: {len(items)} public items ({detail}), limit {args.max}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
