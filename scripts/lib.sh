# Shared helpers for scripts/*.sh; sourced, never run on its own.
# shellcheck shell=bash

CF_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Qwen2.5-Coder-0.5B/1.5B-Instruct Q4_K_M (scripts/setup.sh --models qwen2.5-0.5b,qwen2.5-1.5b).
CF_QWEN05_MODEL_FILE="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
CF_QWEN15_MODEL_FILE="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
# The default model of run.sh, serve.sh and every `chunkfuse -m` (src/base/paths.h): the
# smallest that answers well (docs/benchmarks-history.md, issue 23). setup.sh always fetches it.
CF_DEFAULT_MODEL_FILE="$CF_QWEN05_MODEL_FILE"
# The model of the fast unit tests and the shape files' tokenizer (tests/test_support.cpp):
# SmolLM2-135M-Instruct Q4_1, also always fetched.
CF_TEST_MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
# Optional real model (scripts/setup.sh --models gemma3), same cache folder.
CF_GEMMA3_MODEL_FILE="gemma-3-270m-q4_k_m.gguf"
CF_JOBS="${CHUNKFUSE_JOBS:-2}"

cf_log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
cf_die() { cf_log "error: $*"; exit 1; }

# Same rule as src/base/paths.cpp, so scripts and binaries agree on the model's location.
cf_cache_root() {
  if [[ -n "${XDG_CACHE_HOME:-}" ]]; then
    printf '%s/chunkfuse' "$XDG_CACHE_HOME"
  else
    printf '%s/.cache/chunkfuse' "${HOME:-/tmp}"
  fi
}

cf_model_path() {
  if [[ -n "${CHUNKFUSE_MODEL:-}" ]]; then
    printf '%s' "$CHUNKFUSE_MODEL"
  else
    printf '%s/models/%s' "$(cf_cache_root)" "$CF_DEFAULT_MODEL_FILE"
  fi
}

# Configure and build a CMake tree with Ninja. Extra args go to cmake; CF_TARGETS (space
# separated) limits the build to those targets.
cf_build() {
  local dir="$1" type="$2"
  shift 2
  # ccache (installed by setup.sh) when present: objects are shared between the build trees
  # and between clones of the repository (paths are taken relative to the clone, and the
  # folder a debug build ran in is left out of the hash), so a rebuild of unchanged files
  # costs a cache look-up. CHUNKFUSE_CCACHE=0 builds without it.
  local launcher=()
  if [[ "${CHUNKFUSE_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null; then
    export CCACHE_BASEDIR="$CF_REPO_ROOT" CCACHE_NOHASHDIR=1
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  else
    launcher=(-UCMAKE_CXX_COMPILER_LAUNCHER)
  fi
  # Re-running cmake on a configured tree is cheap and applies changed options.
  cf_log "configure $dir ($type${*:+ $*})"
  cmake -S "$CF_REPO_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" "${launcher[@]}" "$@" >/dev/null || return 1
  cf_log "build $dir (-j$CF_JOBS${CF_TARGETS:+, targets: $CF_TARGETS})"
  # shellcheck disable=SC2086  # targets are deliberately word-split
  ninja -C "$dir" -j"$CF_JOBS" ${CF_TARGETS:-}
}

# ggml's CPU flags for a llama.cpp peer built on this machine (scripts/setup.sh --bench,
# bench/build_llama_server.sh): GGML_NATIVE=ON (-march=native; repacking is on by default),
# except on a CPU with AMX, whose ggml matmul crashes on our Xeon hosts (SIGILL in
# tinygemm_kernel_amx, issue 57; bench/README.md, "The peer"): there every other extension of
# the CPU is named and AMX is off.
cf_ggml_cpu_flags() {
  if ! grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    printf '%s' "-DGGML_NATIVE=ON"
    return
  fi
  local flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  flags+=" -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  local f
  for f in avx512vbmi:VBMI avx512_vnni:VNNI avx512_bf16:BF16; do
    if grep -qw "${f%%:*}" /proc/cpuinfo; then flags+=" -DGGML_AVX512_${f##*:}=ON"; fi
  done
  printf '%s' "$flags"
}

# Seconds since the epoch, for phase timings.
cf_now() { date +%s; }
