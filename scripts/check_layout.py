#!/usr/bin/env python3
"""The layout check behind scripts/check-layout.sh (see --help there or here).

Fails when the library's module files import each other in a circle, when a
file of src/ grows past the line limit outside its tests, when a `#[path]`
attribute makes one file of src/ a module of another, or when a unit-test file
is named `*_tests.rs`. Standard library only.

The unit-test layout these last two keep: a module's tests are a
`#[cfg(test)] mod tests { .. }` at the end of its file, or, for a folder module
whose tests are long, `tests.rs` (or a `tests/` folder) beside its `mod.rs`,
declared `#[cfg(test)] mod tests;`. A `#[path]` that points outside src/ may
stay: src/demo.rs takes examples/quickstart.rs as its kernel (the example stays
the one copy users read), and unit tests include the checkers in tests/ that the
integration tests share; those files are not the library's modules.

How it reads Rust, in short: comments and string/char literals are blanked out
first (keeping every offset and newline), so nothing inside them counts; then
`#[cfg(test)]` items are located by bracket matching and skipped; `use` trees
are parsed into leaf paths; other paths (`crate::x::Y` in code) are found by a
regex. Every path is made absolute (`super::`, `self::`, child modules, names
bound by `use`) and resolved to the longest prefix that is a known module, then
through `pub use` re-exports to the file that defines the item, so
`crate::perfetto::PerfettoLayer` lands on src/perfetto/layer.rs rather than on
the facade src/perfetto/mod.rs.

Known limits (it is a lexer and a few rules, not rustc):
- No macro expansion. Paths written inside macro invocations count as written;
  `$crate::` in a `macro_rules!` body counts for the file that defines the macro.
- Glob re-exports (`pub use x::*`) are not followed: an item reached through
  one is charged to the module that re-exports it.
- A facade's own use of a name it re-exports is found by a word search, which a
  field or method of the same name can fool.
- Every cfg other than test (features, targets) is taken as on.
- `#[path]` modules are skipped by the import graph (the #[path] rule names
  those inside src/); modules that main.rs declares itself, and
  src/bin/*, belong to binaries and are line-checked only.
"""

import argparse
import bisect
import io
import os
import re
import sys
import tempfile
from collections import defaultdict, deque

# Default limit when this script is run directly; check-layout.sh passes its own
# MAX_LINES.
MAX_LINES = 800

# --------------------------------------------------------------------------
# Lexing: blank out comments and literals.

# The next place where a comment or a literal may start. A literal prefix
# (b, c, r, br, cr) only counts when it does not end a longer identifier.
_SPECIAL = re.compile(r"""/[/*]|(?<![\w$])(?:[bc]?r\#*"|[bc]["'])|["']""")
_BLOCK_COMMENT_TOKEN = re.compile(r"/\*|\*/")
_STRING_BODY = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_CHAR = re.compile(r"""'(?:[^'\\\n]|\\(?:u\{[0-9A-Fa-f_]*\}|x[0-9A-Fa-f]{2}|.))'""")
_NOT_NEWLINE = re.compile(r"[^\n]")


def _blank(s):
    return _NOT_NEWLINE.sub(" ", s)


def strip_rust(src):
    """`src` with comments, strings and char literals replaced by spaces.

    Offsets and newlines are kept, so positions and line numbers still match the
    original. Lifetimes (`'a`) are left alone.
    """
    out = []
    i, n = 0, len(src)
    while i < n:
        m = _SPECIAL.search(src, i)
        if not m:
            out.append(src[i:])
            break
        s, tok = m.start(), m.group()
        out.append(src[i:s])
        if tok == "//":
            e = src.find("\n", s)
            e = n if e < 0 else e
        elif tok == "/*":
            depth, e = 0, n
            for c in _BLOCK_COMMENT_TOKEN.finditer(src, s):
                depth += 1 if c.group() == "/*" else -1
                if depth == 0:
                    e = c.end()
                    break
        elif tok.endswith('"') and "r" in tok:  # raw string: r"..", br#".."#
            hashes = tok.count("#")
            close = src.find('"' + "#" * hashes, m.end())
            e = n if close < 0 else close + 1 + hashes
        elif tok.endswith('"'):  # "..", b"..", c".."
            q = m.end() - 1
            sm = _STRING_BODY.match(src, q)
            e = sm.end() if sm else n
        else:  # ' or b': a char literal, or (a bare ') a lifetime or label
            q = m.end() - 1
            cm = _CHAR.match(src, q)
            if cm:
                e = cm.end()
            else:
                out.append(tok)
                i = m.end()
                continue
        out.append(_blank(src[s:e]))
        i = e
    return "".join(out)


# --------------------------------------------------------------------------
# One source file.

_BRACKET = re.compile(r"[{}()\[\]]")
_OPEN_FOR = {"}": "{", ")": "(", "]": "["}
_ATTR = re.compile(r"#\s*(!?)\s*\[")
_INLINE_MOD = re.compile(r"(?<![\w$])mod\s+(?:r#)?(\w+)\s*\{")
_MOD_DECL = re.compile(r"(?<![\w$])mod\s+(?:r#)?(\w+)\s*;")
_USE = re.compile(r"(?<![\w$#])use\b(?!\s*<)")
_PUB_BEFORE = re.compile(r"\bpub\s*(?:\([^()]*\))?\s*$")
_USE_TOKEN = re.compile(r"\$crate|r#\w+|\w+|::|[{},*]")
_ITEM_SCAN = re.compile(r"[;{(\[}\])]")
# Items that end at their `;` even when they hold braces (`use a::{b};`,
# `const X: S = S { .. };`); any other item ends with its first `{..}` block.
_SEMI_ITEM = re.compile(
    r"(?:pub\s*(?:\([^()]*\))?\s*)?"
    r"(?:use\b|static\b|type\b|let\b|extern\s+crate\b|const\s+(?:r#)?\w+\s*:)"
)
# A path of two or more segments, not itself the tail of a longer path.
_PATH = re.compile(r"(?<![\w$:.])(\$crate|(?:r#)?[A-Za-z_]\w*)((?:\s*::\s*(?:r#)?\w+)+)")
_PATH_SEP = re.compile(r"\s*::\s*")
_CFG_TOKEN = re.compile(r"\w+|[(),=]")
_SPACE = re.compile(r"\s*")


def _test_only(content):
    """Whether an attribute's content is a cfg that holds only under test.

    `cfg(test)`, `cfg(all(test, ..))`, `cfg(any(test, all(test, ..)))`: yes.
    `cfg(not(test))`, `cfg(any(test, feature = ".."))`, `cfg_attr(..)`: no.
    """
    toks = _CFG_TOKEN.findall(content)
    if len(toks) < 3 or toks[0] != "cfg" or toks[1] != "(":
        return False

    def pred(i):  # -> (test only?, index after the predicate)
        name = toks[i] if i < len(toks) else ""
        i += 1
        if i < len(toks) and toks[i] == "(":
            i += 1
            args = []
            while i < len(toks) and toks[i] != ")":
                if toks[i] == ",":
                    i += 1
                    continue
                v, i = pred(i)
                args.append(v)
            i += 1
            if name == "all":
                return any(args), i
            if name == "any":
                return bool(args) and all(args), i
            return False, i  # not(..) and anything else
        if i < len(toks) and toks[i] == "=":  # key = "value" (value blanked)
            return False, i + 1
        return name == "test", i

    return pred(2)[0]


class Source:
    """A .rs file, lexed: where its tests, inline modules and `use`s are."""

    def __init__(self, path, rel, text):
        self.path = path
        self.rel = rel  # as shown to people: src/a/b.rs
        self.text = text
        self.code = strip_rust(text)
        self.newlines = [m.start() for m in re.finditer("\n", self.code)]
        self.n_lines = len(self.newlines) + (0 if text.endswith("\n") or not text else 1)
        self._match_brackets()
        self._find_tests()
        self.inline_mods = [
            (m.group(1), m.end() - 1, self.match.get(m.end() - 1, len(self.code)))
            for m in _INLINE_MOD.finditer(self.code)
            if not self.in_test(m.start())
        ]
        self.uses = list(self._find_uses())
        self._non_test_lines = None

    def line(self, pos):
        return bisect.bisect_left(self.newlines, pos) + 1

    def _match_brackets(self):
        self.match = {}  # opening offset -> closing offset
        self.open_of = {}  # closing offset -> opening offset
        stack = []
        for m in _BRACKET.finditer(self.code):
            c, p = m.group(), m.start()
            if c in "{([":
                stack.append((c, p))
                continue
            # Tolerate unbalanced code: drop openers until one of this kind.
            while stack and stack[-1][0] != _OPEN_FOR[c]:
                stack.pop()
            if stack:
                o = stack.pop()[1]
                self.match[o] = p
                self.open_of[p] = o

    def _item_end(self, s):
        """End offset of the item (or statement) starting at `s`."""
        s = _SPACE.match(self.code, s).end()
        semi = bool(_SEMI_ITEM.match(self.code, s))
        p = s
        while True:
            m = _ITEM_SCAN.search(self.code, p)
            if not m:
                return len(self.code)
            c = m.group()
            if c == ";":
                return m.end()
            if c in "}])":  # the enclosing block closes: the item ended before
                return m.start()
            close = self.match.get(m.start(), len(self.code) - 1)
            if c == "{" and not semi:
                return close + 1
            p = close + 1

    def attrs_before(self, pos):
        """Contents of the outer attributes just before `pos` (past `pub(..)`)."""
        out = []
        head = self.code[:pos].rstrip()
        m = _PUB_BEFORE.search(head[-60:])
        if m:
            head = head[: len(head) - len(head[-60:]) + m.start()].rstrip()
        while head.endswith("]"):
            close = len(head) - 1
            o = self.open_of.get(close)
            if o is None:
                break
            before = head[:o].rstrip()
            if not before.endswith("#"):
                break
            out.append(self.code[o + 1 : close])
            head = before[:-1].rstrip()
        return out

    def _find_tests(self):
        """Offsets covered by test-only items, merged and sorted."""
        ranges = []
        self.whole_file_test = False
        for m in _ATTR.finditer(self.code):
            o = m.end() - 1
            close = self.match.get(o)
            if close is None or not _test_only(self.code[o + 1 : close]):
                continue
            if m.group(1):  # #![cfg(test)]: the enclosing module is test-only
                enclosing = [(a, b) for a, b in self.match.items() if a < o < b and self.code[a] == "{"]
                if not enclosing:
                    self.whole_file_test = True
                    ranges.append((0, len(self.code)))
                else:
                    a, b = max(enclosing)
                    ranges.append((a, b + 1))
                continue
            s = close + 1
            while True:  # skip the attributes that follow
                n = _ATTR.match(self.code, _SPACE.match(self.code, s).end())
                if not n or n.group(1) or n.end() - 1 not in self.match:
                    break
                s = self.match[n.end() - 1] + 1
            ranges.append((m.start(), self._item_end(s)))
        ranges.sort()
        merged = []
        for a, b in ranges:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.tests = merged
        self._test_starts = [a for a, _ in merged]

    def in_test(self, pos):
        i = bisect.bisect_right(self._test_starts, pos) - 1
        return i >= 0 and pos < self.tests[i][1]

    def non_test_lines(self):
        """Lines that hold no part of a test-only item."""
        if self._non_test_lines is not None:
            return self._non_test_lines
        covered = set()
        for a, b in self.tests:
            covered.update(range(self.line(a), self.line(max(a, b - 1)) + 1))
        self._non_test_lines = self.n_lines - len(covered & set(range(1, self.n_lines + 1)))
        return self._non_test_lines

    def scope(self, pos):
        """Names of the inline modules (`mod x { .. }`) enclosing `pos`, outermost first."""
        return tuple(name for name, a, b in self.inline_mods if a < pos < b)

    def path_attrs(self):
        """`#[path = ".."]` attributes: (the path as written, line)."""
        for m in _ATTR.finditer(self.code):
            o = m.end() - 1
            close = self.match.get(o)
            if close is None or not re.match(r"\s*path\s*=", self.code[o + 1 : close]):
                continue
            lit = re.search(r'"((?:[^"\\]|\\.)*)"', self.text[o + 1 : close])
            if lit:
                yield lit.group(1), self.line(m.start())

    def mod_decls(self):
        """`mod x;` declarations: (name, scope, test-only?, has #[path]?)."""
        for m in _MOD_DECL.finditer(self.code):
            attrs = self.attrs_before(m.start())
            has_path = any(re.match(r"\s*path\s*=", a) for a in attrs)
            test = self.in_test(m.start()) or any(_test_only(a) for a in attrs)
            yield m.group(1), self.scope(m.start()), test, has_path

    def _find_uses(self):
        """`use` leaves outside tests: (segments, binding, pub?, offset, span)."""
        for m in _USE.finditer(self.code):
            if self.in_test(m.start()):
                continue
            end = self.code.find(";", m.end())
            end = len(self.code) if end < 0 else end
            is_pub = bool(_PUB_BEFORE.search(self.code[max(0, m.start() - 60) : m.start()]))
            toks = [(t.group(), t.start()) for t in _USE_TOKEN.finditer(self.code, m.end(), end)]
            leaves = []
            try:
                _parse_use_tree(toks, 0, [], leaves)
            except IndexError:
                pass  # malformed (or a macro fragment): keep what parsed
            for segs, binding, pos in leaves:
                yield segs, binding, is_pub, pos, (m.start(), end)


def _parse_use_tree(toks, i, prefix, out):
    """Parses one use tree at toks[i] into `out` as (segments, binding, offset).

    The binding is the name the leaf brings into scope: its last segment, its
    `as` name, "*" for a glob, None for `as _`. Returns the index after the tree.
    """
    segs = list(prefix)
    while True:
        tok, pos = toks[i]
        if tok == "{":
            i += 1
            while toks[i][0] != "}":
                i = _parse_use_tree(toks, i, segs, out)
                if toks[i][0] == ",":
                    i += 1
            return i + 1
        if tok == "*":
            out.append((segs, "*", pos))
            return i + 1
        if tok == "::":  # leading `::`: an extern crate
            segs.append("::")
            i += 1
            continue
        segs.append(tok)
        i += 1
        if i < len(toks) and toks[i][0] == "::":
            i += 1
            continue
        break
    binding = segs[-1]
    if segs[-1] == "self":  # `use a::b::{self}` binds `b`
        segs = segs[:-1]
        binding = segs[-1] if segs else None
    if i < len(toks) and toks[i][0] == "as":
        binding = toks[i + 1][0]
        binding = None if binding == "_" else binding
        i += 2
    out.append((segs, binding, pos))
    return i


# --------------------------------------------------------------------------
# The crate: files, modules, edges.


def module_path(rel_parts):
    """('a', 'b.rs') -> ('crate', 'a', 'b'); lib.rs -> ('crate',); mod.rs -> its folder."""
    parts = list(rel_parts)
    last = parts.pop()[: -len(".rs")]
    if not (last == "mod" or (last == "lib" and not parts)):
        parts.append(last)
    return ("crate",) + tuple(parts)


class Crate:
    def __init__(self, root, max_lines):
        self.root = os.path.abspath(root)
        self.max_lines = max_lines
        shown_base = os.path.dirname(self.root)
        self.files = []  # every Source under root
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(".rs"):
                    p = os.path.join(dirpath, f)
                    with open(p, encoding="utf-8", errors="replace") as fh:
                        text = fh.read()
                    self.files.append(Source(p, os.path.relpath(p, shown_base), text))
        self._classify()
        self._index_modules()
        self.edges = {}  # (from, to) -> (line, written path, via re-export?)
        for src in self.files:
            if self.node_of.get(src.path):
                self._collect_edges(src)

    # ---- which files are graph nodes

    def _classify(self):
        self.node_of = {}  # path -> module path, for the library's files
        self.test_file = set()  # paths of files that hold only tests
        main_only, test_mods = set(), set()
        by_module = {}
        for src in self.files:
            parts = os.path.relpath(src.path, self.root).split(os.sep)
            is_main = parts == ["main.rs"]
            if parts[0] == "bin" and len(parts) > 1:  # src/bin/*: other binaries
                continue
            if parts[-1] == "tests.rs" or "tests" in parts[:-1] or src.whole_file_test:
                self.test_file.add(src.path)
            if is_main:
                # Modules that the binary declares for itself (`mod cli;` in
                # main.rs) are the binary's, not the library's.
                for name, scope, _, has_path in src.mod_decls():
                    if not has_path and not scope:
                        main_only.add(("crate", name))
                continue
            mp = module_path(parts)
            by_module[mp] = src
            for name, scope, test, has_path in src.mod_decls():
                if test and not has_path:
                    test_mods.add(mp + scope + (name,))

        def under(mp, roots):
            return any(mp[: len(r)] == r for r in roots)

        for mp, src in by_module.items():
            if under(mp, main_only):
                continue
            if under(mp, test_mods):
                self.test_file.add(src.path)
            if src.path not in self.test_file:
                self.node_of[src.path] = mp
        self.file_of = {mp: src for src in self.files for mp in [self.node_of.get(src.path)] if mp}

    # ---- modules, bindings and re-exports, for resolving paths

    def _index_modules(self):
        # Every module, file or inline -> the file that holds it.
        self.module_file = dict(self.file_of)
        for mp, src in self.file_of.items():
            for name, a, b in src.inline_mods:
                self.module_file[mp + src.scope(a + 1)] = src
        self.bindings = defaultdict(dict)  # module -> name -> (segments, module)
        self.exports = defaultdict(dict)  # module -> name -> (segments, module)
        for mp, src in self.file_of.items():
            for segs, binding, is_pub, pos, _ in src.uses:
                if binding in (None, "*"):
                    continue
                scope = mp + src.scope(pos)
                self.bindings[scope][binding] = (segs, scope)
                if is_pub:
                    self.exports[scope][binding] = (segs, scope)

    def absolute(self, segs, scope, depth=0):
        """`segs` as written in module `scope`, made absolute; None if external."""
        if not segs or depth > 8:
            return None
        first, rest = segs[0], list(segs[1:])
        if first in ("crate", "$crate"):
            return ["crate"] + rest
        if first in ("self", "super"):
            cur, i = list(scope), 1 if first == "self" else 0
            while i < len(segs) and segs[i] == "super":
                if len(cur) <= 1:  # above the crate root
                    return None
                cur.pop()
                i += 1
            return cur + list(segs[i:])
        if tuple(scope) + (first,) in self.module_file:  # a child module
            return list(scope) + list(segs)
        bound = self.bindings.get(tuple(scope), {}).get(first)
        if bound:
            base = self.absolute(bound[0], bound[1], depth + 1)
            return None if base is None else base + rest
        return None  # an extern crate, the prelude, or a local item

    def resolve(self, abs_segs):
        """The file that defines `abs_segs`, following `pub use`; (file, followed?)."""
        segs, followed = list(abs_segs), False
        for _ in range(8):
            k = len(segs)
            while k > 0 and tuple(segs[:k]) not in self.module_file:
                k -= 1
            if k == 0:
                return None, followed
            mod = tuple(segs[:k])
            if k < len(segs):
                exp = self.exports.get(mod, {}).get(segs[k])
                if exp:
                    target = self.absolute(exp[0], exp[1])
                    if target is not None and target != segs[: len(target)]:
                        segs, followed = target + segs[k + 1 :], True
                        continue
            return self.module_file[mod], followed
        return None, followed

    def is_folder_module(self, mp):
        return any(len(o) == len(mp) + 1 and o[: len(mp)] == mp for o in self.file_of)

    # ---- edges

    def _add_edge(self, src, segs, scope, pos, written):
        target = self.absolute(segs, scope)
        if target is None:
            return
        dst, followed = self.resolve(target)
        if dst is None or dst is src:
            return
        key = (self.node_of[src.path], self.node_of[dst.path])
        line = src.line(pos)
        if key not in self.edges or line < self.edges[key][0]:
            self.edges[key] = (line, written, followed)

    def _collect_edges(self, src):
        mp = self.node_of[src.path]
        facade = self.is_folder_module(mp)
        reexports, spans = [], set()
        for segs, binding, is_pub, pos, (a, b) in src.uses:
            scope = mp + src.scope(pos)
            if facade and is_pub:
                # A facade re-exporting is not an edge (its users are routed to
                # the defining file instead); its own code using the name is.
                if binding not in (None, "*"):
                    reexports.append((binding, scope, segs))
            else:
                self._add_edge(src, segs, scope, pos, "::".join(segs))
            spans.add((a, b))
        # The code with its `use` statements blanked, for the path scan below.
        pieces, last = [], 0
        for a, b in sorted(spans):
            pieces += [src.code[last:a], " " * (b - a)]
            last = b
        code = "".join(pieces) + src.code[last:]
        for m in _PATH.finditer(code):
            if src.in_test(m.start()):
                continue
            scope = mp + src.scope(m.start())
            segs = [m.group(1)] + _PATH_SEP.split(m.group(2))[1:]
            first = segs[0]
            # A path from a plain name counts only if the name is a child
            # module or bound by a `use`; else it is external (std::, Vec::..).
            if first not in ("crate", "$crate", "self", "super"):
                child = scope + (first,) in self.module_file
                if not child and first not in self.bindings.get(scope, {}):
                    continue
            self._add_edge(src, segs, scope, m.start(), "::".join(segs))
        for name, scope, segs in reexports:
            for m in re.finditer(r"(?<![\w$:.])" + re.escape(name) + r"\b", code):
                if not src.in_test(m.start()) and mp + src.scope(m.start()) == scope:
                    self._add_edge(src, segs, scope, m.start(), "::".join(segs))
                    break

    # ---- verdicts

    def sccs(self):
        """Strongly connected components of more than one file (Tarjan)."""
        graph = defaultdict(list)
        for a, b in sorted(self.edges):
            graph[a].append(b)
        index, low, on, stack, out = {}, {}, set(), [], []
        counter = [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in graph[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

        sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * len(self.node_of) + 100))
        for v in sorted(set(self.node_of.values())):
            if v not in index:
                visit(v)
        return sorted(out)

    def cycles(self):
        """Cycles that between them use every edge inside every component.

        A component can hold many elementary cycles; showing, for each edge not
        yet shown, the shortest cycle through it names every edge that would
        have to go, without listing them all.
        """
        result = []
        for comp in self.sccs():
            members = set(comp)
            inner = sorted(e for e in self.edges if e[0] in members and e[1] in members)
            succ = defaultdict(list)
            for a, b in inner:
                succ[a].append(b)
            shown = set()
            for a, b in inner:
                if (a, b) in shown:
                    continue
                prev, queue = {b: None}, deque([b])  # shortest path b -> a
                while queue and a not in prev:
                    v = queue.popleft()
                    for w in succ[v]:
                        if w not in prev:
                            prev[w] = v
                            queue.append(w)
                path, v = [], a
                while v is not None:
                    path.append(v)
                    v = prev[v]
                cycle = [a] + path[::-1]  # a, b, ..., a
                shown.update(zip(cycle, cycle[1:]))
                result.append(cycle)
        return result

    def long_files(self):
        out = []
        for src in self.files:
            if src.path in self.test_file:
                continue
            n = src.non_test_lines()
            if n > self.max_lines:
                out.append((src.rel, n))
        return out

    def path_links(self):
        """`#[path]`s from a file of src/ to a file of src/: (file, line, path, target)."""
        out = []
        for src in self.files:
            for written, line in src.path_attrs():
                # Relative to the file's folder (rustc's rule outside inline
                # modules; inside one the folder is deeper, still under src/).
                target = os.path.normpath(os.path.join(os.path.dirname(src.path), written))
                if target == self.root or target.startswith(self.root + os.sep):
                    shown = os.path.relpath(target, os.path.dirname(self.root))
                    out.append((src.rel, line, written, shown))
        return out

    def misnamed_tests(self):
        """Files named `*_tests.rs`, which the one unit-test layout does not use."""
        return [src.rel for src in self.files if os.path.basename(src.path).endswith("_tests.rs")]

    def largest(self):
        sizes = [(src.non_test_lines(), src.rel) for src in self.files if src.path not in self.test_file]
        return max(sizes) if sizes else (0, "-")

    def describe_edge(self, a, b):
        line, written, followed = self.edges[(a, b)]
        name = "::".join(b)
        via = f" via {written}" if followed else ""
        return f"{self.file_of[a].rel} uses {name}{via} at line {line}"


# --------------------------------------------------------------------------
# The command.


def check(root, max_lines, graph=False, out=sys.stdout, err=sys.stderr):
    crate = Crate(root, max_lines)
    if graph:
        for (a, b) in sorted(crate.edges):
            line, written, _ = crate.edges[(a, b)]
            where = f"{crate.file_of[a].rel}:{line}"
            print(f"{'::'.join(a)} -> {'::'.join(b)}  ({where}: {written})", file=out)
    problems = []
    for cycle in crate.cycles():
        names = " -> ".join("::".join(m) for m in cycle)
        why = "; ".join(crate.describe_edge(x, y) for x, y in zip(cycle, cycle[1:]))
        problems.append(f"layout: import cycle: {names} ({why})")
    for rel, n in crate.long_files():
        problems.append(f"layout: {rel} has {n} lines outside its tests (limit {max_lines}): split it")
    for rel, line, written, target in crate.path_links():
        problems.append(
            f"layout: {rel}:{line}: #[path = \"{written}\"] makes {target} a module of another file "
            "of src/: declare it where it lies (mod x; beside its parent)"
        )
    for rel in crate.misnamed_tests():
        problems.append(
            f"layout: {rel}: unit tests go in a #[cfg(test)] mod tests at the end of their "
            "file, or in tests.rs / tests/ beside a folder's mod.rs, not in *_tests.rs"
        )
    for p in problems:
        print(p, file=err)
    n_files = sum(1 for s in crate.files if s.path not in crate.test_file)
    size, name = crate.largest()
    if problems:
        print(f"layout: FAILED, {len(problems)} problem(s) in {n_files} files", file=err)
        return 1, crate
    print(
        f"layout: {n_files} files, {len(crate.edges)} import edges, no cycles, "
        f"largest file {size} lines ({name})",
        file=out,
    )
    return 0, crate


def self_test(max_lines):
    """Checks the verdicts on small fake trees; returns the exit status."""
    filler = "fn f{0}() {{}}\n"

    def lines(n, start=0):
        return "".join(filler.format(i) for i in range(start, start + n))

    big = max_lines + 1
    cases = [
        (
            "cycle through super::",
            {
                "lib.rs": "pub mod a;\n",
                "a/mod.rs": "mod x;\nmod y;\n",
                "a/x.rs": "use super::y::Y;\npub struct X;\n",
                "a/y.rs": "pub struct Y;\nfn f() { let _ = super::x::X; }\n",
            },
            [["crate::a::x", "crate::a::y"]],
            [],
        ),
        (
            "cycle through a grouped, multi-line use crate::{..}",
            {
                "lib.rs": "mod b;\nmod c;\nmod d;\n",
                "b.rs": "use crate::{\n    c::C,\n    d::{D, E},\n};\npub struct B;\n",
                "c.rs": "pub struct C;\nfn f() -> crate::b::B { crate::b::B }\n",
                "d.rs": "pub struct D;\npub struct E;\n",
            },
            [["crate::b", "crate::c"]],
            [],
        ),
        (
            "a facade's re-exports are no edges; a user of one is routed to the child",
            {
                "lib.rs": "pub mod p;\npub mod u;\npub mod w;\n",
                "p/mod.rs": "mod q;\nmod r;\npub use q::Q;\npub(crate) use self::r::{R as Arr, S};\n"
                "pub enum Error {}\n",
                "p/q.rs": "use super::Error;\nuse crate::u::U;\npub struct Q;\n",
                "p/r.rs": "use super::Error;\npub struct R;\npub struct S;\n",
                "u.rs": "use crate::p::Q;\npub struct U;\n",
                "w.rs": "pub fn f() -> crate::p::Arr { todo!() }\n",
            },
            [["crate::p::q", "crate::u"]],
            [],
            [
                "crate::p::q -> crate::p",
                "crate::p::q -> crate::u",
                "crate::p::r -> crate::p",
                "crate::u -> crate::p::q",
                "crate::w -> crate::p::r",
            ],
        ),
        (
            "a folder module using its child by name",
            {
                "lib.rs": "mod k;\n",
                "k/mod.rs": "mod m;\nuse m::M;\npub fn k(_: M) {}\n",
                "k/m.rs": "pub struct M;\nfn f() { super::k(M) }\n",
            },
            [["crate::k", "crate::k::m"]],
            [],
        ),
        (
            "cfg(test) uses, comments and strings are no edges",
            {
                "lib.rs": "mod e;\nmod f;\nmod g;\n",
                "e.rs": "pub struct E;\n#[cfg(test)]\nuse crate::f::G;\n"
                "#[cfg(test)]\nmod helper;\n"
                "#[cfg(all(test, feature = \"x\"))]\n#[allow(unused)]\nmod tests {\n"
                "    use crate::f::F;\n    fn t() { crate::g::h(); }\n}\n",
                "e/helper.rs": "use crate::f::F;\n",
                "f.rs": "use crate::e::E;\npub struct F;\npub struct G;\n",
                "g.rs": "// use crate::e::E;\n/// [`crate::e::E`]\n/* crate::e::E /* nested */ crate::e */\n"
                "pub fn h() -> &'static str { let _c = '\"'; \"crate::e::E\" }\n"
                "pub fn i() -> &'static str { r#\"use crate::e::E;\"# }\n",
            },
            [],
            [],
            ["crate::f -> crate::e"],
        ),
        (
            "code after a cfg(test) block still counts; braces in literals are skipped",
            {
                "lib.rs": "mod i;\nmod j;\n",
                "i.rs": "#[cfg(test)]\nmod tests {\n    const A: char = '}';\n    const S: &str = \"}}\";\n"
                "    // }\n    fn f<'a>(x: &'a str) -> &'a str { x }\n}\n\nuse crate::j::J;\npub struct I;\n",
                "j.rs": "use crate::i::I;\npub struct J;\n",
            },
            [["crate::i", "crate::j"]],
            [],
        ),
        (
            f"line limit: {big} plain lines fail, {max_lines + 100} with 200 in tests pass",
            {
                "lib.rs": "mod long;\nmod tested;\n#[cfg(test)]\nmod tests;\n",
                "long.rs": lines(big),
                "tested.rs": lines(max_lines - 100)
                + "#[cfg(test)]\nmod tests {\n"
                + lines(197, 10_000)
                + "}\n",
                "tests.rs": lines(big + 100),
                "main.rs": '#[path = "../elsewhere.rs"]\nmod elsewhere;\n' + lines(big),
            },
            [],
            ["src/long.rs", "src/main.rs"],
        ),
        (
            "a file naming itself is no edge",
            {"lib.rs": "pub mod a;\n", "a.rs": "use crate::a::X;\npub struct X;\nfn f() -> self::X { X }\n"},
            [],
            [],
        ),
    ]
    # The #[path] and test-file rules: (name, files, want path links, want misnamed).
    layout_cases = [
        (
            "#[path] between files of src/ fails, #[path] outside src/ passes",
            {
                "lib.rs": "mod a;\nmod demo;\n",
                "a/mod.rs": '#[cfg(test)]\n#[path = "a_tests.rs"]\nmod tests;\n'
                '#[path = "../b.rs"] mod b;\n',
                "a/a_tests.rs": "fn t() {}\n",
                "b.rs": "pub struct B;\n",
                "demo.rs": '#[path = "../examples/quickstart.rs"]\nmod quickstart;\n'
                '#[cfg(test)]\n#[path = "../../tests/check/mod.rs"]\nmod check;\n'
                '// #[path = "b.rs"] in a comment\nconst S: &str = "#[path = \\"b.rs\\"]";\n',
            },
            [("src/a/mod.rs", 2, "a_tests.rs", "src/a/a_tests.rs"), ("src/a/mod.rs", 4, "../b.rs", "src/b.rs")],
            ["src/a/a_tests.rs"],
        ),
        (
            "the adopted layouts: inline mod tests, tests.rs and tests/ beside mod.rs",
            {
                "lib.rs": "mod a;\nmod c;\nmod d;\n",
                "a.rs": "pub fn a() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n",
                "c/mod.rs": "#[cfg(test)]\nmod tests;\n",
                "c/tests.rs": "fn t() {}\n",
                "d/mod.rs": "#[cfg(test)]\nmod tests;\n",
                "d/tests/mod.rs": "mod graphs;\n",
                "d/tests/graphs.rs": "fn t() {}\n",
            },
            [],
            [],
        ),
    ]
    failed = 0

    def fail(name, what, want, got):
        nonlocal failed
        failed += 1
        print(f"layout self-test FAILED: {name}: {what}: want {want!r}, got {got!r}", file=sys.stderr)

    for name, files, want_cycles, want_long, *want_edges in cases:
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "src")
            for rel, text in files.items():
                p = os.path.join(root, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as fh:
                    fh.write(text)
            crate = Crate(root, max_lines)
            got_cycles = [["::".join(m) for m in c] for c in crate.sccs()]
            got_long = [rel for rel, _ in crate.long_files()]
            got_edges = [f"{'::'.join(a)} -> {'::'.join(b)}" for a, b in sorted(crate.edges)]
            if got_cycles != want_cycles:
                fail(name, "cycles", want_cycles, got_cycles)
            if got_long != want_long:
                fail(name, "files over the limit", want_long, got_long)
            if want_edges and got_edges != want_edges[0]:
                fail(name, "edges", want_edges[0], got_edges)
            # The messages and exit status, on the first case (a cycle) and on
            # the last (clean).
            if name in (cases[0][0], cases[-1][0]):
                out, err = io.StringIO(), io.StringIO()
                rc, _ = check(root, max_lines, out=out, err=err)
                want = (
                    (1, "layout: import cycle: crate::a::x -> crate::a::y -> crate::a::x "
                     "(src/a/x.rs uses crate::a::y at line 1; src/a/y.rs uses crate::a::x at line 2)")
                    if name == cases[0][0]
                    else (0, "layout: 2 files, 0 import edges, no cycles, largest file 3 lines (src/a.rs)")
                )
                got = (rc, (err.getvalue() or out.getvalue()).splitlines()[0])
                if got != want:
                    fail(name, "exit status and first line", want, got)
    for name, files, want_links, want_misnamed in layout_cases:
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "src")
            for rel, text in files.items():
                p = os.path.join(root, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as fh:
                    fh.write(text)
            crate = Crate(root, max_lines)
            if crate.path_links() != want_links:
                fail(name, "#[path] links", want_links, crate.path_links())
            if crate.misnamed_tests() != want_misnamed:
                fail(name, "*_tests.rs files", want_misnamed, crate.misnamed_tests())
            rc, _ = check(root, max_lines, out=io.StringIO(), err=io.StringIO())
            if rc != (1 if want_links or want_misnamed else 0):
                fail(name, "exit status", 1 if want_links or want_misnamed else 0, rc)
    if failed:
        return 1
    print(f"layout self-test: {len(cases) + len(layout_cases)} cases passed")
    return 0


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        prog="check-layout.sh",
        description="Fails when modules of src/ import each other in a circle, when a "
        "file of src/ has more than --max-lines lines outside #[cfg(test)] items, when a "
        "#[path] joins two files of src/, or when a file is named *_tests.rs.",
    )
    ap.add_argument(
        "root",
        nargs="?",
        default=os.path.join(here, "..", "src"),
        help="the src/ folder to check (default: the repository's)",
    )
    ap.add_argument("--graph", action="store_true", help="print the import edges first (stdout)")
    ap.add_argument("--self-test", action="store_true", help="check the checker on small fake trees")
    ap.add_argument("--max-lines", type=int, default=MAX_LINES, help=f"line limit (default {MAX_LINES})")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(args.max_lines)
    if not os.path.isdir(args.root):
        print(f"layout: no such folder: {args.root}", file=sys.stderr)
        return 2
    return check(args.root, args.max_lines, graph=args.graph)[0]


if __name__ == "__main__":
    sys.exit(main())
