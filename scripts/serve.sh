#!/usr/bin/env bash
# Sets up, builds and starts `chunkfuse serve` with its web page (the knowledge assistant of
# issue 12): open http://127.0.0.1:8080/ui/ in a browser. Arguments go to `chunkfuse serve`
# (e.g. --port 9000, --api-key KEY, --host 0.0.0.0). Environment: CHUNKFUSE_MODEL (default:
# Qwen2.5-Coder-0.5B-Instruct, README "Models"), CHUNKFUSE_BUILD_DIR (default build),
# CHUNKFUSE_JOBS (default 2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$CF_REPO_ROOT"

build_dir="${CHUNKFUSE_BUILD_DIR:-build}"
scripts/setup.sh
CF_TARGETS=chunkfuse cf_build "$build_dir" Release
exec "$build_dir/chunkfuse" serve -m "$(cf_model_path)" "$@"
