#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cpp) with clang-14, ASan and UBSan, and runs
# each for a number of seconds over a seed corpus; fails on any crash, sanitizer report,
# leak, timeout or out-of-memory.
#
#   scripts/fuzz.sh          60 seconds per target
#   scripts/fuzz.sh 30       30 seconds per target
#
# Seeds: tools/make_<name>_seeds.py OUT_DIR, when present, writes valid inputs for
# <name>_fuzz. The corpus a run grows is kept in <build>/fuzz-corpus/<target> and reused
# by the next run; inputs that fail are saved as <build>/fuzz-artifacts/<target>-crash-*.
# Environment: CHUNKFUSE_FUZZ_BUILD_DIR (default build-fuzz), CHUNKFUSE_JOBS (default 2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$CF_REPO_ROOT"

seconds="${1:-60}"
[[ "$seconds" =~ ^[0-9]+$ ]] || cf_die "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]"
build_dir="${CHUNKFUSE_FUZZ_BUILD_DIR:-build-fuzz}"
command -v clang++-14 >/dev/null || cf_die "clang++-14 not found (scripts/setup.sh installs it)"

targets=()
for src in fuzz/*_fuzz.cpp; do
  [[ -e "$src" ]] && targets+=("$(basename "$src" .cpp)")
done
((${#targets[@]})) || cf_die "no fuzz/*_fuzz.cpp targets"

# Warnings stay errors in the GCC Release build; clang's own set is not gated here (the
# whole serve layer is built for http_request_fuzz).
CXX=clang++-14 CF_TARGETS="${targets[*]}" cf_build "$build_dir" RelWithDebInfo -DCHUNKFUSE_FUZZ=ON \
  -DCMAKE_CXX_COMPILER=clang++-14 -DCHUNKFUSE_WERROR=OFF || cf_die "fuzz build failed"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# The executed inputs libFuzzer's -print_final_stats reports in a run's log (0 when absent).
fuzz_executed_units() {
  local n
  n="$(sed -n 's/^stat::number_of_executed_units: *\([0-9][0-9]*\).*/\1/p' "$1" | tail -n 1)"
  echo "${n:-0}"
}

failed=0
for target in "${targets[@]}"; do
  name="${target%_fuzz}"
  corpus="$build_dir/fuzz-corpus/$target"
  seeds="$build_dir/fuzz-seeds/$target"
  artifacts="$build_dir/fuzz-artifacts"
  mkdir -p "$corpus" "$seeds" "$artifacts"
  if [[ -f "tools/make_${name}_seeds.py" ]]; then
    python3 "tools/make_${name}_seeds.py" "$seeds"
  fi
  opts=()
  [[ -f "fuzz/$name.dict" ]] && opts=(-dict="fuzz/$name.dict")
  # fuzz/<name>.flags: the target's own libFuzzer flags (e.g. a larger -max_len), one line.
  if [[ -f "fuzz/$name.flags" ]]; then
    read -r -a flags <"fuzz/$name.flags"
    opts+=("${flags[@]}")
  fi
  cf_log "fuzz $target for ${seconds}s (corpus $corpus, $(find "$seeds" -type f | wc -l) seeds)"
  # -timeout: one input taking >10 s is a hang; -rss_limit_mb also caps single mallocs,
  # so a file that makes the reader allocate hugely is reported as a finding.
  log="$artifacts/$target.log"
  if ! "$build_dir/$target" "${opts[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$target-" "$corpus" "$seeds" 2>&1 | tee "$log"; then
    cf_log "FAIL: $target found a crash; inputs in $artifacts (reproduce: $build_dir/$target FILE)"
    failed=1
  fi
  # fuzz/<name>.min_runs: the fewest inputs a run must execute, so that the target stays a
  # search and not a smoke test (issue 59: the whole-server target gets ~43 in 40 s).
  if [[ -f "fuzz/$name.min_runs" ]]; then
    read -r min_runs <"fuzz/$name.min_runs"
    runs="$(fuzz_executed_units "$log")"
    if ((runs < min_runs)); then
      cf_log "FAIL: $target executed $runs inputs, fewer than the $min_runs of fuzz/$name.min_runs"
      failed=1
    else
      cf_log "$target executed $runs inputs (at least $min_runs)"
    fi
  fi
done
exit "$failed"
