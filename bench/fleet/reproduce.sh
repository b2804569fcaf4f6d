#!/usr/bin/env bash
# The whole fleet comparison of bench/README.md ("fleet"), from a build dir:
#   bench/fleet/reproduce.sh [BUILD_DIR] [OUT_DIR]
# 1. trains the learned actor when qrt-fleet-train was built (LibTorch),
#    else uses the committed bench/fleet/model/actor.mlp;
# 2. sweep: 4 structures x 3 regimes x 8 loads x seeds 1,2,3 on 64 hosts;
# 3. scale: 8..1024 hosts at load 0.9;
# 4. claims: backfill+gang vs fifo, admission control.
# Writes OUT_DIR/{train.log,sweep.txt,sweep.json,*.svg,scale.txt,scale.json,
# claims.txt,claims.json}.  Single-threaded; see bench/README.md for its time.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
out=${2:-$here/bench/fleet/results}
mkdir -p "$out"
sim=$build/bench/fleet/qrt-fleet-sim
train=$build/bench/fleet/qrt-fleet-train
model=$here/bench/fleet/model/actor.mlp
start=$(date +%s)
if [ -x "$train" ] && [ "${QRT_FLEET_RETRAIN:-1}" = 1 ]; then
  model=$out/actor.mlp
  echo "[fleet] training (seed 1) -> $model"
  "$train" --seed 1 --out "$model" > "$out/train.log"
  tail -1 "$out/train.log"
fi
echo "[fleet] sweep ($(( $(date +%s) - start )) s so far)"
"$sim" sweep --seeds 1,2,3 --hosts 64 --hours 2 --model "$model" --out "$out" \
  > "$out/sweep.txt" 2> "$out/sweep.log"
echo "[fleet] scale ($(( $(date +%s) - start )) s so far)"
"$sim" scale --hosts-list 8,32,128,512,1024 --load 0.9 --model "$model" --out "$out" \
  > "$out/scale.txt" 2> "$out/scale.log"
echo "[fleet] claims ($(( $(date +%s) - start )) s so far)"
"$sim" claims --seeds 1,2 --hosts 64 --hours 2 --out "$out" > "$out/claims.txt" 2> "$out/claims.log"
echo "[fleet] done in $(( $(date +%s) - start )) s: $out"
