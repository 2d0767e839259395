#!/bin/bash
# A third size class for the 20 x 512 setting (issue 26): requests of 8,000+ context tokens
# planned on their own records. Two-fold over the model's 20 records of the setting (each half
# replayed by a calibration fitted on the other half and on all its HotpotQA and musique_s
# records, classes at 3,000 and 8,000 tokens), against a calibration with the two classes of
# before (3,000 tokens) fitted on the same HotpotQA and musique_s records and none of these 20.
# No model is run.
#   bench/results/issue26_auto_v3/long_class.sh MODEL_PREFIX   (qwen05, qwen15, gemma)  -> long_class/MODEL.*
# LADDER: fit and replay on these steps (the 0.5B's records 0-8 ran EPIC's and ProphetKV's).
set -euo pipefail
cd "$(dirname "$0")/../../.."
M=$1
D=bench/results/issue26_auto_v3; O=$D/long_class; B=${CHUNKFUSE_BIN:-build/chunkfuse}; T=0.5,0.6,0.7,0.8,0.9,0.95,0.99
L=()
[[ -n "${LADDER:-}" ]] && L=(--ladder "$LADDER")
mkdir -p "$O"
LONG=("$D/$M".musique_s_20x512_*.records.jsonl)  # [0, 8), then [8, 20) in one or two runs
FIT=("$D/$M.hotpotqa0-40.records.jsonl" "$D/$M.hotpotqa40-160.records.jsonl" "$D/$M.hotpotqa160-200.records.jsonl"
     "$D/$M.musique_s0-16.records.jsonl" "$D/$M.musique_s16-32.records.jsonl")
$B calibrate --cross-validate 2 --evaluate "${LONG[@]}" --fit "${FIT[@]}" "${L[@]}" --size-classes 3000,8000 --targets $T \
  --report "$O/$M.three_classes.report.json" >/dev/null
$B calibrate --fit "${FIT[@]}" "${L[@]}" --size-classes 3000 --out "$O/$M.two_classes.auto.json" >/dev/null
$B calibrate --evaluate "${LONG[@]}" --calibration "$O/$M.two_classes.auto.json" --targets $T \
  --report "$O/$M.two_classes.report.json" >/dev/null
python3 tools/auto_quality_report.py matrix "$O/$M.two_classes.report.json" "$O/$M.three_classes.report.json" \
  --label "$M, 20 x 512, 2 classes (none of these fitted)" --label "$M, 20 x 512, 3 classes (two-fold)" | tee "$O/$M.md"
