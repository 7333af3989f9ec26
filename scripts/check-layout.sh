#!/usr/bin/env bash
# The layout check (run by scripts/test.sh): fails when modules of src/ import
# each other in a circle, or when a file of src/ has more than MAX_LINES lines
# outside its #[cfg(test)] items. Needs only python3; the parser and the rules
# are in scripts/check_layout.py.
#
#   scripts/check-layout.sh [--graph] [ROOT]   check ROOT (default: src/)
#   scripts/check-layout.sh --self-test        check the checker on fake trees
#   scripts/check-layout.sh --help
set -euo pipefail
MAX_LINES=800
exec python3 "$(dirname "$0")/check_layout.py" --max-lines "$MAX_LINES" "$@"
