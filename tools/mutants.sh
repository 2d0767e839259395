#!/usr/bin/env bash
# Mutation check (issue 24): see tools/mutants.py for what it does and tools/mutants.list
# for the defects. Usage: tools/mutants.sh [name-substring ...]. Not part of CI (each mutant
# rebuilds one file and relinks a test binary: ~20-40 min for the whole list on 2 cores).
exec python3 "$(dirname "${BASH_SOURCE[0]}")/mutants.py" "$@"
