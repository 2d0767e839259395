#!/usr/bin/env python3
"""Mutation check (issue 24): applies each small deliberate defect of tools/mutants.list,
one at a time, to a scratch copy of the working tree, builds the test binary that should
notice it, runs the named tests and reports which mutants survived. Every mutant must be
killed (exit status 1 otherwise). Never touches the working tree it is started from.

  tools/mutants.sh                 # all mutants
  tools/mutants.sh sampler-top-p   # those whose name contains one of the arguments
  MUTANTS_DIR=/tmp/x tools/mutants.sh   # scratch folder (default /tmp/chunkfuse-mutants-$USER)

The scratch copy keeps its own build folder (Release, Ninja, ccache when installed), so a
second run rebuilds only what the mutants touch. CHUNKFUSE_JOBS sets ninja's -j (default 2).

Each entry of tools/mutants.list is a block of `key: value` lines, blocks separated by a
blank line; `#` starts a comment line:
  name:    short id
  file:    path in the repository
  find:    exact text that must occur exactly once in the file (\\n for a newline)
  replace: its replacement
  target:  the ninja target(s) to build (space separated)
  run:     the command that must fail, run in the scratch copy's root ({build} is the build
           folder), e.g. `{build}/test_runtime --gtest_filter=Sampler*`
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse(path):
    blocks, cur = [], {}
    for raw in path.read_text().splitlines():
        line = raw.rstrip("\n")
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        key, _, value = line.partition(":")
        cur[key.strip()] = value.strip().replace("\\n", "\n")
    if cur:
        blocks.append(cur)
    for b in blocks:
        missing = {"name", "file", "find", "replace", "target", "run"} - b.keys()
        if missing:
            sys.exit(f"mutants.list: entry {b.get('name', '?')} lacks {', '.join(sorted(missing))}")
    return blocks


def sh(cmd, cwd, env, log):
    with open(log, "a") as f:
        f.write(f"\n$ {cmd}\n")
        f.flush()
        return subprocess.run(cmd, shell=True, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode


def main():
    wanted = sys.argv[1:]
    mutants = [m for m in parse(REPO / "tools" / "mutants.list") if not wanted or any(w in m["name"] for w in wanted)]
    if not mutants:
        sys.exit("no mutant matches " + " ".join(wanted))
    scratch = Path(os.environ.get("MUTANTS_DIR", f"/tmp/chunkfuse-mutants-{os.environ.get('USER', 'u')}"))
    src = scratch / "src"
    build = scratch / "build"
    log = scratch / "mutants.log"
    if scratch.resolve() == REPO or REPO in scratch.resolve().parents:
        sys.exit("MUTANTS_DIR must be outside the repository")
    scratch.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    # The working tree as it is (tracked and untracked-but-not-ignored files), copied over the
    # scratch tree; files no longer in the tree are removed there.
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.split(b"\0")
    files = [f.decode() for f in files if f and (REPO / f.decode()).is_file()]
    if src.exists():
        keep = set(files)
        for p in src.rglob("*"):
            if p.is_file() and str(p.relative_to(src)) not in keep:
                p.unlink()
    for f in files:
        s, d = REPO / f, src / f
        if not d.exists() or d.read_bytes() != s.read_bytes():
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)
    env = dict(os.environ, CCACHE_BASEDIR=str(src), CCACHE_NOHASHDIR="1")
    jobs = os.environ.get("CHUNKFUSE_JOBS", "2")
    if not (build / "build.ninja").exists():
        launcher = "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache" if shutil.which("ccache") else ""
        if sh(f"cmake -S . -B {build} -G Ninja -DCMAKE_BUILD_TYPE=Release {launcher}", src, env, log):
            sys.exit(f"configure failed, see {log}")
    targets = sorted({t for m in mutants for t in m["target"].split()})
    print(f"baseline: building {' '.join(targets)} in {build} (log: {log})", flush=True)
    if sh(f"ninja -C {build} -j{jobs} {' '.join(targets)}", src, env, log):
        sys.exit(f"baseline build failed, see {log}")
    # Every test command must pass on the unmutated tree, else a 'kill' means nothing.
    for run in sorted({m["run"] for m in mutants}):
        if sh(run.format(build=build), src, env, log):
            sys.exit(f"baseline run fails before any mutation: {run} (see {log})")
    rows, survived = [], 0
    for m in mutants:
        path = src / m["file"]
        original = path.read_text()
        n = original.count(m["find"])
        if n != 1:
            rows.append((m["name"], f"INVALID (find text occurs {n} times in {m['file']})"))
            survived += 1
            continue
        t0 = time.time()
        try:
            path.write_text(original.replace(m["find"], m["replace"]))
            if sh(f"ninja -C {build} -j{jobs} {m['target']}", src, env, log):
                verdict = "INVALID (does not build)"
                survived += 1
            elif sh(m["run"].format(build=build), src, env, log):
                verdict = "killed"
            else:
                verdict = "SURVIVED"
                survived += 1
        finally:
            path.write_text(original)
        rows.append((m["name"], f"{verdict} by {m['run'].split()[0].replace('{build}/', '')} "
                                f"{' '.join(m['run'].split()[1:])} ({time.time() - t0:.0f}s)"))
        print(f"  {rows[-1][0]:<34} {rows[-1][1]}", flush=True)
    # Leave the scratch build matching the unmutated tree for the next run.
    sh(f"ninja -C {build} -j{jobs} {' '.join(targets)}", src, env, log)
    print("\nmutant                             verdict")
    for name, verdict in rows:
        print(f"  {name:<34} {verdict}")
    print(f"\n{len(rows) - survived} of {len(rows)} mutants killed" + (f"; {survived} not killed" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
