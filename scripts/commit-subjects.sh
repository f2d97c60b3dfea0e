#!/usr/bin/env bash
# Commit subjects a reader can scan (house style): every commit since the rule began has a
# subject of at most 72 characters, the detail in its body. The commits checked are those after
# the one named in .ci/subjects-base (the last commit landed before the rule); where a shallow
# clone lacks it, the commits the clone has. Exit 1 naming each long subject.
set -uo pipefail
cd "$(dirname "$0")/.."
max=72
base=$(tr -d '[:space:]' < .ci/subjects-base)
if git cat-file -e "$base^{commit}" 2>/dev/null; then
    range="$base..HEAD"
else
    echo "commit-subjects: $base is not in this clone (shallow?): checking the commits it has"
    range="HEAD"
fi
bad=0
n=0
while IFS= read -r line; do
    n=$((n + 1))
    hash=${line%% *}
    subject=${line#* }
    if [ "${#subject}" -gt "$max" ]; then
        echo "commit $hash: subject of ${#subject} characters (at most $max): $subject"
        bad=1
    elif [ -z "${subject// /}" ]; then
        echo "commit $hash: empty subject"
        bad=1
    fi
done < <(git log --no-merges --format='%h %s' "$range")
echo "commit-subjects: $n commits checked ($range), $( [ "$bad" = 0 ] && echo 'every subject fits' || echo 'some do not')"
exit "$bad"
