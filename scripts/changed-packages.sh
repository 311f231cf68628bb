#!/usr/bin/env bash
# Print the Go packages a change touched (make check-fast), one a line,
# as ./paths: every package with a file changed since the merge base with
# BASE (default main), committed or not, and untracked files too. The
# embedded web/, docs/ and api/ have no tests of their own: internal/server
# serves them and internal/app's end-to-end tests check them (the contract,
# the demo page, the guide's links), so a change there lists both. A
# change to db/ (migrations, queries) lists nothing: it can reach every
# package, and only make test says it did not.
set -euo pipefail
cd "$(dirname "$0")/.."

base=${1:-main}
since=$(git merge-base "$base" HEAD 2>/dev/null || git rev-parse HEAD)

{
  git diff --name-only "$since" --
  git ls-files --others --exclude-standard
} | sort -u | while IFS= read -r f; do
  case $f in
    web/* | docs/* | api/*) printf '%s\n' internal/server internal/app ;;
    *.go) dirname "$f" ;;
  esac
done | sort -u | while IFS= read -r dir; do
  # Only directories that still hold Go files (a deleted package has none).
  if compgen -G "$dir/*.go" >/dev/null; then echo "./$dir"; fi
done
