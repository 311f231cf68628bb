#!/usr/bin/env bash
# Copy the tree to DEST (a new or empty directory): the tracked files and
# the untracked ones git does not ignore, as they are in the working tree
# (uncommitted changes included), without .git. check-rename.sh,
# check-walkthrough.sh and check-exercises.sh work on such a copy, so the
# working tree is never touched.
set -euo pipefail
dest=$(realpath -m "$1")
cd "$(dirname "$0")/.."
mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do
    if [[ -e $f || -L $f ]]; then printf '%s\0' "$f"; fi
  done |
  xargs -0 -r cp -P --preserve=mode --parents -t "$dest"
