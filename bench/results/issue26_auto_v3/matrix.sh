#!/bin/bash
# Issue 26's measure on every model it can run, every request held out from the calibration
# that replays it (no model is run; records of this folder, the HotpotQA records of SmolLM2
# in ../issue26_auto_v2). Each model as it ships: size classes at 3,000 and 8,000 context
# tokens where it has 20 records of the 20 x 512 setting to plan the third on (the Qwen files,
# Gemma 3), else at 3,000 (SmolLM2, whose 8K context cannot hold the setting).
#   HotpotQA    five-fold (cv5.sh): each fifth replayed by a calibration fitted on the other
#               four fifths and all musique_s (and 20 x 512) records
#   musique_s   two-fold: each half replayed by a calibration fitted on the other half and all
#               HotpotQA (and 20 x 512) records
#   20 x 512    two-fold (long_class.sh): each half replayed by a calibration fitted on the other
#               half and all HotpotQA and musique_s records; a model with fewer than 20 such
#               records: by the calibration it ships, none of them fitted
#   bench/results/issue26_auto_v3/matrix.sh   -> matrix/*.report.json, matrix/matrix.md (also on stdout)
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=bench/results/issue26_auto_v3; O=$D/matrix; B=${CHUNKFUSE_BIN:-build/chunkfuse}; T=0.5,0.6,0.7,0.8,0.9,0.95,0.99
SMOL_LADDER=prophet:0.05,prophet:0.15,prophet:0.3
mkdir -p "$O"
declare -A FP=([qwen05]=d0e8c3f92ab566b9 [qwen15]=dd1e7a4913b1de15 [gemma]=cce1938318fa873b [smollm2]=8fe8bd56461abfd6)
long_records() {  # model: its 20 x 512 records files, when they are at least 20 records
  local files=("$D/$1".musique_s_20x512_*.records.jsonl)
  [[ -f "${files[0]}" ]] && (( $(cat "${files[@]}" | wc -l) >= 20 )) && echo "${files[@]}"
  return 0
}
hotpotqa() {  # model [hotpotqa dir]: its HotpotQA records files
  local h=${2:-$D}
  echo "$h/$1.hotpotqa0-40.records.jsonl $D/$1.hotpotqa40-160.records.jsonl $h/$1.hotpotqa160-200.records.jsonl"
}
musique_cv() {  # model [ladder] [hotpotqa dir]
  local l=() long bounds=3000
  [[ -n "${2:-}" ]] && l=(--ladder "$2")
  long=$(long_records "$1")
  [[ -n "$long" ]] && bounds=3000,8000
  # shellcheck disable=SC2046,SC2086
  $B calibrate --cross-validate 2 --evaluate $D/$1.musique_s0-16.records.jsonl $D/$1.musique_s16-32.records.jsonl \
    --fit $(hotpotqa "$1" "${3:-}") $long "${l[@]}" --size-classes $bounds --targets $T --report "$O/$1.musique_s.report.json" >/dev/null
}
# The ladder each model ships (the 0.5B's first 20 x 512 records ran ProphetKV's steps too).
declare -A LADDERS=([qwen05]=reuse:0,epic:0.05,epic:0.15,epic:0.3 [qwen15]= [gemma]=)
for m in qwen05 qwen15 gemma; do
  LADDER=${LADDERS[$m]} bash $D/cv5.sh $m >/dev/null
  musique_cv $m "${LADDERS[$m]}"
  if [[ -n "$(long_records $m)" ]]; then
    LADDER=${LADDERS[$m]} bash $D/long_class.sh $m >/dev/null
    cp $D/long_class/$m.three_classes.report.json "$O/$m.20x512.report.json"
  else  # by the shipped calibration, which none of these records fitted
    $B calibrate --evaluate "$D/$m".musique_s_20x512_*.records.jsonl --calibration "data/auto_calibrations/${FP[$m]}.auto.json" \
      --targets $T --report "$O/$m.20x512.report.json" >/dev/null
  fi
done
HOTPOTQA_DIR=bench/results/issue26_auto_v2 LADDER=$SMOL_LADDER bash $D/cv5.sh smollm2 >/dev/null
musique_cv smollm2 $SMOL_LADDER bench/results/issue26_auto_v2
reports=(); labels=()
for m in "qwen05:Qwen 0.5B" "qwen15:Qwen 1.5B" "gemma:Gemma 3 270M" "smollm2:SmolLM2 135M"; do
  IFS=: read -r p name <<<"$m"
  plan=size
  [[ -f "$D/cv5/$p.size3.report.json" ]] && plan=size3
  reports+=("$D/cv5/$p.$plan.report.json" "$O/$p.musique_s.report.json")
  labels+=(--label "$name, HotpotQA" --label "$name, musique_s")
  if [[ -f "$O/$p.20x512.report.json" ]]; then
    reports+=("$O/$p.20x512.report.json")
    labels+=(--label "$name, 20 x 512")
  fi
done
python3 tools/auto_quality_report.py matrix "${reports[@]}" "${labels[@]}" --targets 0.8,0.9,0.95,0.99 | tee "$O/matrix.md"
