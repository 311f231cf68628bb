#!/usr/bin/env bash
# Run the commands of the docs' ```sh blocks (make check-docs), so that a
# walkthrough that names a file, a query or a test fails CI the day it stops
# being true. Each block runs in its own bash, at the repository root, with
# -euo pipefail. Then run the README's session against a fresh demo and
# compare what it answers with what the README shows (check-readme.sh),
# and check the docs' links and the tests they name. First, check that the
# map of the packages in docs/architecture.md is the code's, and that each
# query file has one owner (scripts/architecture.sh --check).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "check-docs: docs/architecture.md's map"
bash scripts/architecture.sh --check

docs=(docs/adding-an-operation.md)
for doc in "${docs[@]}"; do
  n=0
  while IFS= read -r -d '' block; do
    n=$((n + 1))
    echo "check-docs: $doc, block $n"
    bash -euo pipefail -c "$block" >/dev/null || {
      echo "check-docs: $doc, block $n failed:" >&2
      echo "$block" >&2
      exit 1
    }
  done < <(awk '
    /^```sh[[:space:]]*$/ { inblock = 1; block = ""; next }
    /^```/ && inblock    { inblock = 0; printf "%s%c", block, 0; next }
    inblock              { block = block $0 "\n" }
  ' "$doc")
  if [[ $n -eq 0 ]]; then
    echo "check-docs: $doc has no sh blocks; nothing was checked" >&2
    exit 1
  fi
done
# Every relative link in the README and docs must name a file of the
# repository: a clone or a fork has nothing else.
dead=0
for doc in README.md docs/*.md; do
  dir=$(dirname "$doc")
  while IFS= read -r target; do
    case $target in http://* | https://* | mailto:* | "#"*) continue ;; esac
    path=${target%%#*}
    if [[ ! -e "$dir/$path" ]]; then
      echo "check-docs: $doc links to $target, which does not exist" >&2
      dead=1
    fi
  done < <(grep -o '\](\([^)]*\))' "$doc" | sed 's/^](//; s/)$//')
done
[[ $dead -eq 0 ]] || exit 1
# Every test the docs name as evidence (`TestX`, `FuzzX`) must exist: a
# renamed or deleted test would leave a guarantee with no proof behind it.
missing=0
for name in $(grep -oh '`\(Test\|Fuzz\)[A-Za-z0-9_]*`' README.md docs/*.md | tr -d '`' | sort -u); do
  if ! grep -rqs --include='*_test.go' "^func $name(" .; then
    echo "check-docs: the docs name $name, which is not a test of this repository" >&2
    missing=1
  fi
done
[[ $missing -eq 0 ]] || exit 1
bash scripts/check-readme.sh
echo "check-docs: OK"
