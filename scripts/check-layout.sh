#!/usr/bin/env bash
# The layout check (run by scripts/test.sh): fails when modules of src/ import
# each other in a circle, when a file of src/ has more than MAX_LINES lines
# outside its #[cfg(test)] items, when a #[path] makes one file of src/ a module
# of another, or when unit tests sit in a *_tests.rs file. Needs only python3;
# the parser and the rules (and the one unit-test layout) are in
# scripts/check_layout.py.
#
#   scripts/check-layout.sh [--graph] [ROOT]   check ROOT (default: src/)
#   scripts/check-layout.sh --self-test        check the checker on fake trees
#   scripts/check-layout.sh --help
set -euo pipefail
MAX_LINES=800
exec python3 "$(dirname "$0")/check_layout.py" --max-lines "$MAX_LINES" "$@"
