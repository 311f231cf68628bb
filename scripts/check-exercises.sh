#!/usr/bin/env bash
# Check docs/exercises.md (make check-exercises): on a copy of the tree,
# apply each exercise's break (its ```diff exercise block, with git apply;
# then sqlc generate, if it changed a query) and run its command (its
# ```sh exercise block), which must fail in the test it names (`--- FAIL:
# TestName`), not with a build error or in another test; then undo the break. Each command must pass on the
# copy unbroken first, or its failure would prove nothing.
#
# The tests need PostgreSQL on 127.0.0.1:5432 (or TEST_DATABASE_URL).
set -euo pipefail
cd "$(dirname "$0")/.."

export CI="${CI:-true}" GOWORK=off
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
doc=docs/exercises.md
start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/check-exercises.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "check-exercises: $*" >&2
  exit 1
}

# The doc's exercise blocks, in order, each as: kind (diff or sh), US, the block; then NUL.
blocks() {
  awk '
    /^```(diff|sh) exercise[[:space:]]*$/ { kind = substr($1, 4); body = ""; inblock = 1; next }
    inblock && /^```[[:space:]]*$/       { inblock = 0; printf "%s\037%s%c", kind, body, 0; next }
    inblock                              { body = body $0 "\n" }
  ' "$1"
}

bash scripts/copy-tree.sh "$work/tree"
src=$(pwd)
cd "$work/tree"
git init -q && git add -A && git -c user.name=check -c user.email=check@localhost commit -qm tree

n=0 diff=""
while IFS= read -r -d '' block; do
  kind=${block%%$'\037'*} body=${block#*$'\037'}
  if [[ $kind == diff ]]; then
    diff=$body
    continue
  fi
  n=$((n + 1))
  [[ -n $diff ]] || fail "exercise $n of $doc has a command but no diff before it"
  cmd=${body%$'\n'}
  echo "check-exercises: [$((SECONDS - start))s] exercise $n: $cmd"
  out=$(bash -euo pipefail -c "$cmd" 2>&1) || fail "exercise $n: \`$cmd\` fails on the tree without the break:"$'\n'"$out"
  printf '%s' "$diff" | git apply || fail "exercise $n: its diff does not apply to the tree"
  if git diff --name-only | grep -q '^db/queries/'; then
    (cd db && go tool -modfile=../tools/go.mod sqlc generate -f ../sqlc.yaml)
  fi
  if out=$(bash -euo pipefail -c "$cmd" 2>&1); then
    fail "exercise $n: \`$cmd\` passes with the guard removed: the exercise no longer shows what it says"
  fi
  name=$(grep -o 'Test[A-Za-z0-9_]*' <<<"$cmd" | head -1)
  grep -q -- "--- FAIL: $name" <<<"$out" || fail "exercise $n: \`$cmd\` fails, but not in $name:"$'\n'"$out"
  git checkout -q -- . && git clean -fdq
  diff=""
done < <(blocks "$src/$doc")
[[ -z $diff ]] || fail "$doc ends with a diff that no command follows"
((n == 5)) || fail "$doc has $n exercises; it should have five"
echo "check-exercises: OK: each of the $n breaks makes its command fail ($((SECONDS - start))s)"
