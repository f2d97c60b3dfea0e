#!/bin/bash
# renice.sh PID NICE: every 20 ms, threads of PID other than the main thread and nixl-timer get NICE
pid=$1; n=$2
while kill -0 $pid 2>/dev/null; do
  for t in /proc/$pid/task/*; do
    tid=${t##*/}; c=$(cat $t/comm 2>/dev/null)
    [ "$tid" = "$pid" ] && continue
    case "$c" in nixl-timer) continue;; esac
    renice -n $n -p $tid >/dev/null 2>&1
  done
  sleep 0.02
done
