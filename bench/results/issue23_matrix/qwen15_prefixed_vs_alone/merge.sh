#!/bin/bash
# Qwen 1.5B, HotpotQA: every selector on chunk caches computed alone and prefixed,
# paired on the questions all the runs share (issue 23, item 5). The rows come from several
# bench runs of the same settings (full prefill is deterministic, so their full answers agree):
#   ../qwen15_hotpotqa_profiled  alone, ρ 0.15, QCFuse with the 1.5B's profile (80 questions; Cache-Craft and the oracle on 40)
#   ../qwen15_hotpotqa_fusionrag FusionRAG and reuse, alone and prefixed (40 questions; rows with evicted
#                                enriched caches rerun in the seventh session)
#   ../qwen15_hotpotqa_prefixed  the other selectors and reuse, prefixed (the first 13; 40 since the
#                                tenth session, with QCFuse's long-prompt profile as qcfuse:long_profile;
#                                80 since the nineteenth, with FusionRAG at 0/0.05/0.15/0.3 on 40-79
#                                and at 0.05/0.3 on 23 of the first 40)
#   ../qwen15_hotpotqa_longprofile qcfuse:long_profile alone (80 questions; now the shipped profile)
#   ../qwen15_hotpotqa_rho005    the selectors alone at ρ 0.05 (80; FusionRAG and Cache-Craft on 11, on 80 since the eighteenth session)
# Since the eleventh session the prefixed run also holds ρ 0.05 and 0.3 on its first questions
# (every selector but FusionRAG, QCFuse as qcfuse:long_profile), and the profiled run FusionRAG
# and Cache-Craft alone at 0.3: the report pairs each comparison on the questions both sides ran.
# This script keeps their rows of the shared questions in results.jsonl and runs the report.
set -euo pipefail
cd "$(dirname "$0")"
python3 - <<'PY'
import json
runs = ["../qwen15_hotpotqa_prefixed", "../qwen15_hotpotqa_fusionrag", "../qwen15_hotpotqa_profiled",
        "../qwen15_hotpotqa_longprofile", "../qwen15_hotpotqa_rho005"]
rows = {r: [json.loads(l) for l in open(r + "/results.jsonl") if l.strip()] for r in runs}
# The FusionRAG run holds the first 40 questions; the others 80 since the nineteenth session
# (prefixed: FusionRAG's rows of questions 40-79 are in ../qwen15_hotpotqa_prefixed).
shared = set.intersection(*({x["example"] for x in rows[r]} for r in runs if r != "../qwen15_hotpotqa_fusionrag"))
seen, out = set(), []
for r in runs:  # the first run's row wins where two hold the same cell (full prefill)
    for x in rows[r]:
        key = (x["example"], x["method"], x["ratio"], x.get("chunk_context", "alone"))
        if x["example"] in shared and key not in seen and (x["ratio"] in (0.0, 0.05, 0.15, 0.3, 1.0)):
            seen.add(key)
            out.append(x)
with open("results.jsonl", "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in out)
print("%d rows of %d shared questions" % (len(out), len(shared)))
PY
python3 ../../../../tools/bench_report.py . --versus qcfuse
