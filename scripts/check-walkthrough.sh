#!/usr/bin/env bash
# Follow the new resource of docs/adding-an-operation.md word for word on
# a copy of the tree, and check what CI would ask of the result (make
# check-walkthrough). The working tree is not touched: the copy is the
# tracked files and the untracked ones git does not ignore, as in
# check-rename.sh, in a temporary directory removed on exit.
#
# The doc's blocks are read from the doc itself and applied in its order.
# The info string after the opening ``` says what a block is:
#
#   ```LANG file=PATH                 a new file (it must not exist yet)
#   ```LANG file=PATH append          added at the end of PATH, after a blank line
#   ```LANG file=PATH before="TEXT"   inserted before the one line of PATH that contains TEXT
#   ```LANG file=PATH after="TEXT"    inserted after that line
#   ```LANG file=PATH replace="TEXT"  put in that line's place
#   ```sh walkthrough                 commands, run at the copy's root (bash -euo pipefail)
#   ```console walkthrough            `$ command` lines: each is run, and its output must be
#                                     the lines the doc shows under it
#
# TEXT must be in exactly one line of PATH when the block is applied. A
# renderer hides the info string, so the paragraph before a file block must
# name PATH (in backticks) and TEXT, for a reader to see where it goes.
# Plain ```sh blocks are make check-docs's, run on the tree itself; they
# are not run here.
#
# Then, in the copy:
#   1. `git status` (against the copy as it was before the doc's blocks)
#      may show no file that the walkthrough does not name: a file block's
#      PATH, or a path in backticks in the paragraph before one of its
#      blocks (the generated files, named before `make generate`);
#   2. the Go files the blocks wrote are as gofmt writes them;
#   3. go build ./... (the generated code builds), then make check-vet,
#      staticcheck and gosec: over the whole module, as the Makefile runs
#      them for make check;
#   4. make check-spec, with Redocly from the tree's .cache/npm (make
#      check-walkthrough runs make check-tools first);
#   5. bash scripts/architecture.sh --check: the map in
#      docs/architecture.md, and one owner per query file;
#   6. the tests the walkthrough can break, not the whole suite (make test
#      runs that on the tree; here it would double CI's time):
#      - every test of the packages the walkthrough's Go goes in (but
#        internal/app), of internal/server, which serves it, and of
#        internal/postgres (the schema's keys, the id prefixes);
#      - in internal/app, the tests the doc's blocks add, the tests that
#        walk the spec (TestEveryOperationDeclaresItsIdempotencyClass,
#        TestEveryOperationIsolatesCallers, TestProblemCodesAreInTheContract,
#        TestServesSpecAndDemoPage), and the contract table's
#        (internal/app/contract_test.go). Every response of these tests is checked
#        against the spec (conformsToContract).
#      Without -race: the walkthrough adds no concurrency of its own, and
#      make test runs the same code under -race on the tree.
# make check-docs is not run in the copy: the doc and README it checks are
# the tree's, unchanged, and it runs on the tree in the same make check;
# the one part the walkthrough can change, the map, is step 5.
#
# The tests need PostgreSQL on 127.0.0.1:5432 (or TEST_DATABASE_URL).
set -euo pipefail
cd "$(dirname "$0")/.."

export CI="${CI:-true}"
export GOWORK=off

doc=docs/adding-an-operation.md
src=$(pwd)
start=$SECONDS
step="copying the tree"
work=$(mktemp -d "${TMPDIR:-/tmp}/check-walkthrough.XXXXXX")
copy=$work/tree

finish() {
  rc=$?
  rm -rf "$work"
  if [[ $rc -eq 0 ]]; then
    echo "check-walkthrough: OK: $doc's new resource, added to a copy as written, passes the checks ($((SECONDS - start))s)"
  else
    echo "check-walkthrough: FAILED while $step ($((SECONDS - start))s)" >&2
  fi
  exit "$rc"
}
trap finish EXIT

fail() {
  echo "check-walkthrough: $*" >&2
  exit 1
}

# say reports progress, with the seconds since the start.
say() { echo "check-walkthrough: [$((SECONDS - start))s] $*"; }

# The doc's walkthrough blocks, in order, each as: info string, US (0x1f),
# the paragraph before the block, US, the block's lines; then NUL.
blocks() {
  awk '
    !inblock && /^```/ {
      info = substr($0, 4); sub(/[[:space:]]+$/, "", info)
      context = (para != "") ? para : last
      para = ""; last = ""; body = ""; inblock = 1
      next
    }
    inblock && /^```[[:space:]]*$/ {
      inblock = 0
      if (info ~ /(^|[[:space:]])(file=|walkthrough)/) printf "%s\037%s\037%s%c", info, context, body, 0
      next
    }
    inblock              { body = body $0 "\n"; next }
    /^[[:space:]]*$/     { if (para != "") { last = para; para = "" }; next }
                         { para = (para == "") ? $0 : para " " $0 }
  ' "$1"
}

bash scripts/copy-tree.sh "$copy"
# Redocly, for make check-spec, from the tree (ignored by git, like all of
# .cache). Checked now rather than after minutes of work.
[[ -x .cache/npm/node_modules/.bin/redocly ]] || fail "Redocly is not installed: run make check-tools (make check-walkthrough does)"
mkdir "$copy/.cache"
ln -s "$src/.cache/npm" "$copy/.cache/npm"
cd "$copy"
# git's answers in the copy must not depend on the user's configuration.
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
git init -q
git add -A
git -c user.name=check-walkthrough -c user.email=check-walkthrough@localhost commit -q --no-verify -m "the tree, before the walkthrough"
say "following $doc in $copy"

# compare runs the command $cmd of block $n, and fails unless it prints $want.
compare() {
  [[ -n $cmd ]] || return 0
  echo "    \$ $cmd"
  got=$(bash -euo pipefail -c "$cmd" 2>&1) || fail "block $n of $doc: \`$cmd\` failed:"$'\n'"$got"
  if [[ $got != "${want%$'\n'}" ]]; then
    fail "block $n of $doc: \`$cmd\` does not print what the doc shows:"$'\n'"$(diff -u --label doc --label printed <(printf '%s' "$want") <(printf '%s\n' "$got"))"
  fi
}

step="applying $doc's blocks"
named=()     # the files the walkthrough names
written=()   # the Go files its blocks wrote
app_tests=() # the tests its blocks add to internal/app
n=0
while IFS= read -r -d '' record; do
  n=$((n + 1))
  info=${record%%$'\037'*}
  rest=${record#*$'\037'}
  context=${rest%%$'\037'*}
  body=${rest#*$'\037'}
  # Paths in backticks in the paragraph before a block are named by it.
  while IFS= read -r p; do named+=("$p"); done < <(grep -o '`[^` ]*`' <<<"$context" | tr -d '`')

  case $info in
  "sh walkthrough")
    say "block $n: running"
    sed 's/^/    /' <<<"${body%$'\n'}"
    bash -euo pipefail -c "$body" || fail "block $n of $doc failed:"$'\n'"$body"
    continue
    ;;
  "console walkthrough")
    say "block $n: running, and comparing with the doc"
    cmd="" want=""
    while IFS= read -r line; do
      if [[ $line == '$ '* ]]; then
        compare
        cmd=${line#'$ '} want=""
      elif [[ -z $cmd ]]; then
        fail "block $n of $doc: a console block starts with a \`\$ command\` line"
      else
        want+=$line$'\n'
      fi
    done < <(printf '%s' "$body")
    compare
    continue
    ;;
  esac

  re='^[a-z0-9]+ file=([^ "]+)( (append|(before|after|replace)="([^"]+)"))?$'
  [[ $info =~ $re ]] || fail "block $n of $doc: info string '$info' is not 'LANG file=PATH', optionally followed by append, before=\"TEXT\", after=\"TEXT\" or replace=\"TEXT\""
  path=${BASH_REMATCH[1]} where=${BASH_REMATCH[4]} anchor=${BASH_REMATCH[5]}
  if [[ ${BASH_REMATCH[3]} == append ]]; then where=append; fi
  [[ $path != /* && $path != *..* ]] || fail "block $n of $doc: $path is not a path inside the repository"
  [[ $context == *"\`$path\`"* ]] || fail "block $n of $doc: the paragraph before it does not name \`$path\`:"$'\n'"$context"
  [[ -z $anchor || $context == *"$anchor"* ]] || fail "block $n of $doc: the paragraph before it does not say where ($anchor):"$'\n'"$context"
  named+=("$path")
  if [[ $path == *.go ]]; then written+=("$path"); fi
  if [[ $path == internal/app/*_test.go ]]; then
    while IFS= read -r t; do app_tests+=("$t"); done < <(sed -n 's/^func \(Test[A-Za-z0-9_]*\)(.*/\1/p' <<<"$body")
  fi
  printf '%s' "$body" >"$work/block"
  say "block $n: $path${where:+ ($where${anchor:+ \"$anchor\"})}"
  case $where in
  "")
    [[ ! -e $path ]] || fail "block $n of $doc: $path is a new file, but it exists already"
    mkdir -p "$(dirname "$path")"
    cp "$work/block" "$path"
    ;;
  append)
    [[ -f $path ]] || fail "block $n of $doc: $path does not exist"
    { echo; cat "$work/block"; } >>"$path"
    ;;
  *)
    [[ -f $path ]] || fail "block $n of $doc: $path does not exist"
    lines=$(grep -nF -e "$anchor" -- "$path" | cut -d: -f1) || true
    [[ -n $lines && $(grep -c . <<<"$lines") -eq 1 ]] ||
      fail "block $n of $doc: '$anchor' must be in exactly one line of $path; it is in $(grep -c . <<<"$lines")"
    case $where in
    before) { head -n $((lines - 1)) "$path"; cat "$work/block"; tail -n +"$lines" "$path"; } >"$work/edited" ;;
    after) { head -n "$lines" "$path"; cat "$work/block"; tail -n +$((lines + 1)) "$path"; } >"$work/edited" ;;
    replace) { head -n $((lines - 1)) "$path"; cat "$work/block"; tail -n +$((lines + 1)) "$path"; } >"$work/edited" ;;
    esac
    cat "$work/edited" >"$path"
    ;;
  esac
done < <(blocks "$src/$doc")
[[ ${#written[@]} -gt 0 ]] || fail "$doc has no file blocks; nothing was checked"
[[ ${#app_tests[@]} -gt 0 ]] || fail "$doc's blocks add no test to internal/app"

step="comparing git status with the files the walkthrough names"
unnamed=$(git status --porcelain --untracked-files=all | cut -c4- | grep -vxF -f <(printf '%s\n' "${named[@]}")) || true
if [[ -n $unnamed ]]; then
  fail "the walkthrough changed or added files that $doc does not name:"$'\n'"$unnamed"
fi

step="checking the doc's Go is gofmt'ed"
unformatted=$(gofmt -l "${written[@]}")
[[ -z $unformatted ]] || fail "gofmt would change these files, as the doc writes them:"$'\n'"$unformatted"

step="running go build ./... in the copy"
say "go build ./..."
go build ./...

step="running make check-vet check-staticcheck check-gosec in the copy"
say "make check-vet check-staticcheck check-gosec"
make --no-print-directory check-vet check-staticcheck check-gosec

step="running make check-spec in the copy"
say "make check-spec"
make --no-print-directory -o check-tools check-spec

step="checking the map of the packages in the copy"
say "bash scripts/architecture.sh --check"
bash scripts/architecture.sh --check

step="running the tests in the copy"
spec_tests=(TestEveryOperationDeclaresItsIdempotencyClass TestEveryOperationIsolatesCallers TestProblemCodesAreInTheContract TestServesSpecAndDemoPage)
for t in "${spec_tests[@]}"; do
  grep -q "^func $t(" internal/app/*_test.go || fail "internal/app has no test $t: update this script"
done
mapfile -t contract_tests < <(sed -n 's/^func \(Test[A-Za-z0-9_]*\)(.*/\1/p' internal/app/contract_test.go)
run="^($(printf '%s\n' "${app_tests[@]}" "${spec_tests[@]}" "${contract_tests[@]}" | sort -u | paste -sd'|' -))\$"
mapfile -t pkgs < <(printf './%s\n' "${written[@]%/*}" ./internal/server ./internal/postgres | grep -vx './internal/app' | sort -u)
say "go test -count=1 ${pkgs[*]}"
go test -count=1 "${pkgs[@]}"
say "go test -count=1 -run '$run' ./internal/app/"
go test -count=1 -run "$run" ./internal/app/
