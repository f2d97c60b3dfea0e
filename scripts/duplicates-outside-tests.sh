#!/usr/bin/env bash
# Counts the repeated code outside tests (issue 35, "fewer copies"): copies the tracked files
# of a commit (default HEAD) but tests, benches, examples, fuzz targets, the test kit and
# docs into a scratch folder, and runs the tool library's `duplicates` there. Prints its
# summary line and the pairs not marked boilerplate. A developer's tool: `duplicates` is
# not installed on CI.
#   scripts/duplicates-outside-tests.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
command -v duplicates >/dev/null || { echo "duplicates (the tool library's) is not on PATH" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
git archive "$rev" | tar -x -C "$dir"
(cd "$dir" && find . -type d \( -name tests -o -name test -o -name benches -o -name examples \
    -o -name fuzz -o -name testkit \) -prune -exec rm -rf {} + && rm -rf docs &&
    find . \( -name tests.rs -o -name test.rs -o -name '*_tests.rs' -o -name '*_test.rs' \) -delete)
out=$(cd "$dir" && duplicates --seconds 120 --most 200)
echo "$out" | head -n 1
echo "rows listed: $(echo "$out" | grep -c "^D"), not marked boilerplate: $(echo "$out" | grep "^D" | grep -vc boilerplate)"
echo "$out" | grep '^D' | grep -v boilerplate
