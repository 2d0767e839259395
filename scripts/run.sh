#!/usr/bin/env bash
# The main job: set up, build Release, and answer a question over the example passages
# twice, once with full prefill and once with a fusion method over cached chunks (the
# passages' KV caches precomputed into the store first, as a RAG service would), and print
# both answers and both times to first token side by side.
#
#   scripts/run.sh                          the example question: full vs epic
#   scripts/run.sh --method cacheblend --question "Who designed the Carrow Lighthouse?"
#
# --question, --method (the fusion method set against full prefill; default epic, the
# default of `chunkfuse ask`) and --passages replace the defaults; other arguments are passed
# to both `chunkfuse ask` runs as they are (e.g. -t 4, --ratio 0.3). Environment:
# CHUNKFUSE_MODEL (default: Qwen2.5-Coder-0.5B-Instruct, README "Models"),
# CHUNKFUSE_BUILD_DIR (default build), CHUNKFUSE_JOBS (default 2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$CF_REPO_ROOT"

build_dir="${CHUNKFUSE_BUILD_DIR:-build}"

question="Who designed the lighthouse near Port Elwen, and when was it first lit?"
method=epic
passages=examples/passages.jsonl
extra=()
store_args=()  # the options of `ask` that `chunks precompute` shares
while (($#)); do
  case "$1" in
    --question|--method|--passages)
      (($# >= 2)) || cf_die "$1 needs a value"
      declare "${1#--}=$2"
      shift 2 ;;
    -t|--threads|--store|--chunk-context|--chunk-variant)
      (($# >= 2)) || cf_die "$1 needs a value"
      extra+=("$1" "$2"); store_args+=("$1" "$2")
      shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
[[ "$method" != full ]] || cf_die "--method names the fusion method compared with full prefill (e.g. qcfuse, cacheblend)"

scripts/setup.sh
CF_TARGETS=chunkfuse cf_build "$build_dir" Release

model="$(cf_model_path)"
bin="$build_dir/chunkfuse"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# The chunk caches a fusion method reuses; computed once, kept in the store for later runs.
cf_log "chunks precompute: $passages"
"$bin" chunks precompute -m "$model" --passages "$passages" "${store_args[@]}" >/dev/null
cf_log "ask: $question"
"$bin" ask -m "$model" --passages "$passages" --question "$question" --method full --json "${extra[@]}" >"$out/full.json"
"$bin" ask -m "$model" --passages "$passages" --question "$question" --method "$method" --json "${extra[@]}" >"$out/fused.json"
python3 - "$question" "$out/full.json" "$out/fused.json" <<'PY'
import json, sys, textwrap
question, runs = sys.argv[1], [json.load(open(p)) for p in sys.argv[2:]]
print(f"Q: {question}\n")
rows = []
for r in runs:
    how = "full prefill" if r["method"] == "full" else (
        f"{r['method']} ({r['recomputed_tokens']}/{r['context_tokens']} recomputed)")
    rows.append((how, f"{r['ttft_ms']:.1f} ms", r["answer"].strip()))
width = max(len(how) for how, _, _ in rows)
print(f"{'method':<{width}}  {'TTFT':>10}  answer")
for how, ttft, answer in rows:
    lines = textwrap.wrap(answer, 70) or [""]
    print(f"{how:<{width}}  {ttft:>10}  {lines[0]}")
    for more in lines[1:]:
        print(f"{'':<{width}}  {'':>10}  {more}")
full, fused = runs[0]["ttft_ms"], runs[1]["ttft_ms"]
print(f"\nTTFT {full:.1f} ms -> {fused:.1f} ms ({full / fused:.2f}x) on {runs[0]['prompt_tokens']} prompt tokens")
sel = runs[1].get("selection") or {}
if isinstance(sel, dict) and "layers_source" in sel:  # which QCFuse profile chose the tokens
    print(f"{runs[1]['method']} critical layers {sel.get('critical_layers')} from {sel['layers_source']}")
PY
