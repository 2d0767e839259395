#!/bin/bash
# Five-fold cross-validation of the auto policy on a model's HotpotQA records (issue 26):
# `calibrate --cross-validate 5` cuts the records (by example index) into five parts and replays
# each with a calibration fitted on the other four: one plan for all ("hot"), and a plan per
# size class with the model's 32 musique_s records added to every fit, never replayed
# ("size"). One pooled report each; no model is run.
#   bench/results/issue26_auto_v3/cv5.sh [MODEL_PREFIX]   (qwen05 by default; qwen15, gemma, smollm2)
#   -> cv5/MODEL.{hot,size[,size3]}.report.json and cv5/MODEL.tables.md (also on stdout)
# HOTPOTQA_DIR: where the model's HotpotQA records [0, 40) and [160, 200) are (default: this
# folder; SmolLM2's are in ../issue26_auto_v2); those of [40, 160) are here, as far as recorded.
# LADDER: fit and replay on these steps of the records only (SmolLM2's musique_s runs had a
# longer ladder than its HotpotQA ones).
set -euo pipefail
cd "$(dirname "$0")/../../.."
M=${1:-qwen05}
D=bench/results/issue26_auto_v3; O=$D/cv5; B=${CHUNKFUSE_BIN:-build/chunkfuse}; T=0.5,0.6,0.7,0.8,0.9,0.95,0.99
H=${HOTPOTQA_DIR:-$D}
L=()
[[ -n "${LADDER:-}" ]] && L=(--ladder "$LADDER")
mkdir -p "$O"
HOT=("$H/$M.hotpotqa0-40.records.jsonl" "$D/$M.hotpotqa40-160.records.jsonl" "$H/$M.hotpotqa160-200.records.jsonl")
MUS=("$D/$M.musique_s0-16.records.jsonl" "$D/$M.musique_s16-32.records.jsonl")
$B calibrate --cross-validate 5 --evaluate "${HOT[@]}" "${L[@]}" --targets $T --report "$O/$M.hot.report.json" >/dev/null
$B calibrate --cross-validate 5 --evaluate "${HOT[@]}" --fit "${MUS[@]}" "${L[@]}" --size-classes 3000 --targets $T \
  --report "$O/$M.size.report.json" >/dev/null
# "size3": a third class for 8,000+ tokens, planned on the model's 20 x 512 records (where it
# has the 20 that long_class.sh cross-validates), fitted on and never replayed here.
LONG=("$D/$M".musique_s_20x512_*.records.jsonl)
CLASSES=(hot size)
if [[ -f "${LONG[0]}" ]] && (( $(cat "${LONG[@]}" | wc -l) >= 20 )); then
  $B calibrate --cross-validate 5 --evaluate "${HOT[@]}" --fit "${MUS[@]}" "${LONG[@]}" "${L[@]}" --size-classes 3000,8000 \
    --targets $T --report "$O/$M.size3.report.json" >/dev/null
  CLASSES+=(size3)
fi
for c in "${CLASSES[@]}"; do
  echo "== $M, calibration '$c'"
  python3 tools/auto_quality_report.py table "$O/$M.$c.report.json"
  echo
done | tee "$O/$M.tables.md"
