#!/bin/bash
# Issue 26's measure on every model it can run, every request held out from the calibration
# that replays it (no model is run; records of this folder, the HotpotQA records of SmolLM2
# in ../issue26_auto_v2):
#   HotpotQA    five-fold (cv5.sh): each fifth replayed by a calibration fitted on the other
#               four fifths (and, with a plan per size, all 32 musique_s records)
#   musique_s   two-fold: each half replayed by a calibration fitted on the other half and all
#               HotpotQA records (a plan per size); Gemma 3, which ships one plan fitted on
#               HotpotQA alone, by that calibration (no musique_s record fitted)
#   20 x 512    by the calibration the model ships (data/auto_calibrations; none of these
#               records fitted); SmolLM2's 8K context cannot hold the setting
# Each model as it ships: Gemma 3 one plan, the others a plan per size class (3,000 tokens).
#   bench/results/issue26_auto_v3/matrix.sh   -> matrix/*.report.json, the table on stdout
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=bench/results/issue26_auto_v3; O=$D/matrix; B=${CHUNKFUSE_BIN:-build/chunkfuse}; T=0.5,0.6,0.7,0.8,0.9,0.95,0.99
mkdir -p "$O"
bash $D/cv5.sh qwen05 >/dev/null
bash $D/cv5.sh qwen15 >/dev/null
bash $D/cv5.sh gemma >/dev/null
HOTPOTQA_DIR=bench/results/issue26_auto_v2 LADDER=prophet:0.05,prophet:0.15,prophet:0.3 bash $D/cv5.sh smollm2 >/dev/null
hotpotqa() {  # model [hotpotqa dir]: its HotpotQA records files
  local h=${2:-$D}
  echo "$h/$1.hotpotqa0-40.records.jsonl $D/$1.hotpotqa40-160.records.jsonl $h/$1.hotpotqa160-200.records.jsonl"
}
musique_cv() {  # model [ladder] [hotpotqa dir]
  local l=()
  [[ -n "${2:-}" ]] && l=(--ladder "$2")
  # shellcheck disable=SC2046
  $B calibrate --cross-validate 2 --evaluate $D/$1.musique_s0-16.records.jsonl $D/$1.musique_s16-32.records.jsonl \
    --fit $(hotpotqa "$1" "${3:-}") "${l[@]}" --size-classes 3000 --targets $T --report "$O/$1.musique_s.report.json" >/dev/null
}
shipped() {  # model fingerprint records name
  $B calibrate --evaluate "$D/$1.$3.records.jsonl" --calibration "data/auto_calibrations/$2.auto.json" --targets $T \
    --report "$O/$1.$3.report.json" >/dev/null
}
musique_cv qwen05
musique_cv qwen15
musique_cv smollm2 prophet:0.05,prophet:0.15,prophet:0.3 bench/results/issue26_auto_v2
$B calibrate --evaluate $D/gemma.musique_s0-16.records.jsonl $D/gemma.musique_s16-32.records.jsonl \
  --calibration data/auto_calibrations/cce1938318fa873b.auto.json --targets $T --report "$O/gemma.musique_s.report.json" >/dev/null
shipped qwen05 d0e8c3f92ab566b9 musique_s_20x512_0-8
shipped qwen15 dd1e7a4913b1de15 musique_s_20x512_0-8
shipped gemma cce1938318fa873b musique_s_20x512_0-8
reports=(); labels=()
for m in "qwen05:Qwen 0.5B:size" "qwen15:Qwen 1.5B:size" "gemma:Gemma 3 270M:hot" "smollm2:SmolLM2 135M:size"; do
  IFS=: read -r p name plan <<<"$m"
  reports+=("$D/cv5/$p.$plan.report.json" "$O/$p.musique_s.report.json")
  labels+=(--label "$name, HotpotQA" --label "$name, musique_s")
  if [[ -f "$O/$p.musique_s_20x512_0-8.report.json" ]]; then
    reports+=("$O/$p.musique_s_20x512_0-8.report.json")
    labels+=(--label "$name, 20 x 512")
  fi
done
python3 tools/auto_quality_report.py matrix "${reports[@]}" "${labels[@]}" --targets 0.8,0.9,0.95,0.99 | tee "$O/matrix.md"
