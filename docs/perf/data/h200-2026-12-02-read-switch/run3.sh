#!/usr/bin/env bash
# The READ gap is a constant per burst (~130 us, bursts of 2, 4 and 8 alike: run2.log). Does it
# go when decode's context touches the GPU (a 16-byte D2H read of its pool) before the burst,
# i.e. is it the switch from prefill's context (its fill of the sources) to decode's?
set -u
E=.carry/exp
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
f() { grep -E "posted back|verified|rror|panick" ; }
for round in 1 2; do
  for shape in "--blocks 4096 --burst 2 --requests 12" "--blocks 16384 --burst 8 --requests 24"; do
    M="--device cuda --gpus 0,0 --layers 4 --blocks-per-request 2048 --block-bytes 16384 --warmup 1 --post-after-make $shape"
    for t in 0 1; do
      echo "== round $round: touch=$t disagg_kv $M --op read"
      if [ $t = 1 ]; then DISAGG_EXP_TOUCH=1 timeout 90 $E/disagg_kv_touch $M --op read 2>&1 | f
      else timeout 90 $E/disagg_kv_touch $M --op read 2>&1 | f; fi
    done
    echo "== round $round: disagg_kv $M --op write"
    timeout 90 $E/disagg_kv_touch $M --op write 2>&1 | f
  done
done
echo "== end $(date -u +%FT%TZ)"
