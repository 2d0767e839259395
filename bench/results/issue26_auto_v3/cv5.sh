#!/bin/bash
# Five-fold cross-validation of the auto policy on the 0.5B's 200 HotpotQA records (issue 26):
# each fold of 40 is replayed with a calibration fitted on the other 160 (one plan: "hot"; a
# plan per size class with the 32 musique_s records added: "size"). No model is run.
#   bench/results/issue26_auto_v3/cv5.sh   -> cv5/, then the pooled tables on stdout
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=bench/results/issue26_auto_v3; O=$D/cv5; B=${CHUNKFUSE_BIN:-build/chunkfuse}; T=0.5,0.6,0.7,0.8,0.9,0.95,0.99
mkdir -p "$O"
python3 - "$D" "$O" <<'PY'
import json, sys
d, o = sys.argv[1:]
rows = [l for f in ("qwen05.hotpotqa0-40", "qwen05.hotpotqa40-160", "qwen05.hotpotqa160-200")
        for l in open("%s/%s.records.jsonl" % (d, f)) if l.strip()]
for k in range(5):
    with open("%s/part%d.records.jsonl" % (o, k), "w") as f:
        f.writelines(l for l in rows if 40 * k <= json.loads(l)["index"] < 40 * (k + 1))
PY
for k in 0 1 2 3 4; do
  train=()
  for j in 0 1 2 3 4; do [[ $j != "$k" ]] && train+=("$O/part$j.records.jsonl"); done
  $B calibrate --fit "${train[@]}" --out "$O/hot$k.auto.json" >/dev/null
  $B calibrate --fit "${train[@]}" $D/qwen05.musique_s0-16.records.jsonl $D/qwen05.musique_s16-32.records.jsonl \
    --size-classes 3000 --out "$O/size$k.auto.json" >/dev/null
  for c in hot size; do
    $B calibrate --evaluate "$O/part$k.records.jsonl" --calibration "$O/$c$k.auto.json" --targets $T --report "$O/$c$k.report.json" >/dev/null
  done
done
rm -f "$O"/part?.records.jsonl  # copies of the records above
for c in hot size; do echo "== $c"; python3 tools/auto_quality_report.py pool "$O"/$c?.report.json; done
