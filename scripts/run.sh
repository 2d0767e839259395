#!/usr/bin/env bash
# The main job: set up, build Release, and answer a question over the example passages
# with `chunkfuse ask`, printing the answer and the time to first token.
#
#   scripts/run.sh                          the example question, full prefill
#   scripts/run.sh --method full --question "Who designed the Carrow Lighthouse?"
#
# --question, --method and --passages replace the defaults; other arguments are passed
# to `chunkfuse ask` as they are. Environment: CHUNKFUSE_MODEL, CHUNKFUSE_BUILD_DIR
# (default build), CHUNKFUSE_JOBS (default 2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$CF_REPO_ROOT"

build_dir="${CHUNKFUSE_BUILD_DIR:-build}"

question="Who designed the lighthouse near Port Elwen, and when was it first lit?"
method=full
passages=examples/passages.jsonl
extra=()
while (($#)); do
  case "$1" in
    --question|--method|--passages)
      (($# >= 2)) || cf_die "$1 needs a value"
      declare "${1#--}=$2"
      shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done

scripts/setup.sh
CF_TARGETS=chunkfuse cf_build "$build_dir" Release

cf_log "ask ($method): $question"
exec "$build_dir/chunkfuse" ask -m "$(cf_model_path)" \
  --passages "$passages" --question "$question" --method "$method" "${extra[@]}"
