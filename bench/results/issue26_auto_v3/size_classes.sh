#!/bin/bash
# One plan for all request sizes against a plan per size class (issue 26), two folds over
# HotpotQA + musique_s records of one model (no model is run: calibrate --fit / --evaluate).
#   bench/results/issue26_auto_v3/size_classes.sh MODEL_PREFIX   (qwen05, qwen15, gemma)
# Fold 1 fits on HotpotQA [160, 200) + musique_s [0, 16) and replays on HotpotQA [0, 40) and
# musique_s [16, 32); fold 2 the other way round. Calibrations: "hot" on the HotpotQA records
# alone (what shipped before), "mix" on both datasets with one plan, "size" on both with a plan
# for under and one for over 3,000 context tokens. Out: size_classes/MODEL/, then the pooled
# tables (tools/auto_quality_report.py pool) on stdout. HOTPOTQA_DIR: where the HotpotQA records
# are (default: this folder; SmolLM2's are in ../issue26_auto_v2); LADDER: fit and replay on
# these steps of the records only (when the two datasets' runs had different ladders).
set -euo pipefail
cd "$(dirname "$0")/../../.."
M=$1
D=bench/results/issue26_auto_v3
O=$D/size_classes/$M
B=${CHUNKFUSE_BIN:-build/chunkfuse}
T=0.5,0.6,0.7,0.8,0.9,0.95,0.99
H=${HOTPOTQA_DIR:-$D}
L=()
[[ -n "${LADDER:-}" ]] && L=(--ladder "$LADDER")
mkdir -p "$O"
fold() {  # name hotpotqa_fit musique_fit hotpotqa_replay musique_replay
  local n=$1 hot=$H/$M.hotpotqa$2.records.jsonl mus=$D/$M.musique_s$3.records.jsonl
  $B calibrate --fit "$hot" "${L[@]}" --out "$O/$n.hot.auto.json" >/dev/null
  $B calibrate --fit "$hot" "$mus" "${L[@]}" --out "$O/$n.mix.auto.json" >/dev/null
  $B calibrate --fit "$hot" "$mus" "${L[@]}" --size-classes 3000 --out "$O/$n.size.auto.json" >/dev/null
  for c in hot mix size; do
    $B calibrate --evaluate "$H/$M.hotpotqa$4.records.jsonl" --calibration "$O/$n.$c.auto.json" --targets $T \
      --report "$O/$n.$c.on_hotpotqa.json" >/dev/null
    $B calibrate --evaluate "$D/$M.musique_s$5.records.jsonl" --calibration "$O/$n.$c.auto.json" --targets $T \
      --report "$O/$n.$c.on_musique_s.json" >/dev/null
  done
}
fold f1 160-200 0-16 0-40 16-32
fold f2 0-40 16-32 160-200 0-16
for c in hot mix size; do
  for d in hotpotqa musique_s; do
    echo "== $M: calibration '$c' replayed on $d (both folds' held-out requests)"
    python3 tools/auto_quality_report.py pool "$O/f1.$c.on_$d.json" "$O/f2.$c.on_$d.json"
  done
done
