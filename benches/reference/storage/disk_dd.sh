#!/usr/bin/env bash
# What the disk itself does with O_DIRECT, measured with dd in the same run as the benches:
# 16 MiB and 1 MiB blocks, 1 GiB written then read, bypassing the page cache.
#   bash benches/reference/storage/disk_dd.sh [DIR]
set -euo pipefail
DIR="${1:-/tmp}"
F="$DIR/nixl-dd-$$.bin"
trap 'rm -f "$F"' EXIT
for bs in 16M 1M; do
    count=$(( 1024 / ${bs%M} ))
    w=$(dd if=/dev/zero of="$F" bs=$bs count=$count oflag=direct conv=fsync 2>&1 | tail -1)
    r=$(dd if="$F" of=/dev/null bs=$bs count=$count iflag=direct 2>&1 | tail -1)
    echo "dd O_DIRECT bs=$bs WRITE: ${w##*, }"
    echo "dd O_DIRECT bs=$bs READ:  ${r##*, }"
done
