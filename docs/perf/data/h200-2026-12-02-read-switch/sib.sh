#!/usr/bin/env bash
# sib.sh BIN ARGS...: prefill and decode as sibling processes (neither starts the other).
# SIB_FIRST=decode is not possible (decode needs prefill's address); prefill starts first.
bin=$1; shift
log=$(mktemp)
"$bin" "$@" --decode external > "$log" 2>&1 &
p=$!
for i in $(seq 1 200); do
  addr=$(sed -n 's/^prefill: listening \([^ ]*\) .*/\1/p' "$log")
  [ -n "$addr" ] && break
  sleep 0.05
done
"$bin" "$@" --role decode --peer "$addr" 2>&1
wait $p
cat "$log"
rm -f "$log"
