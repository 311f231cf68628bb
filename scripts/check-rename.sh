#!/usr/bin/env bash
# Prove that a fork can rename the module and the project's name (make
# check-rename): copy the tree (tracked files, plus untracked files that
# are not ignored) into a temporary directory, run scripts/rename-module.sh
# there, check that the old path and the old name's spellings (database,
# metric prefix, image, User-Agent) are gone, then build, vet and test the
# copy. The working tree is not touched. The generated code is not
# regenerated: it is committed, and the rename rewrites its imports.
#
# The tests need PostgreSQL on 127.0.0.1:5432 (or TEST_DATABASE_URL).
set -euo pipefail
cd "$(dirname "$0")/.."

export CI="${CI:-true}"
export GOWORK=off

old=$(awk '$1 == "module" { gsub(/"/, "", $2); print $2; exit }' go.mod)
old_name=$(sed -nE 's|.*DefaultDatabaseURL = "postgres://[^/]*/([a-z0-9_]+)\?.*|\1|p' internal/config/config.go)
new=example.com/fork/shop
if [[ $old == "$new" ]]; then new=example.com/fork2/store; fi
new_name=${new##*/}

start=$SECONDS
step="copying the tree"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-rename.XXXXXX")

finish() {
  rc=$?
  rm -rf "$tmp"
  if [[ $rc -eq 0 ]]; then
    echo "check-rename: OK: a copy renamed $old -> $new (name $old_name -> $new_name) builds, vets and passes its tests ($((SECONDS - start))s)"
  else
    echo "check-rename: FAILED while $step ($((SECONDS - start))s); if building or testing failed, check whether the working tree itself fails the same way" >&2
  fi
  exit "$rc"
}
trap finish EXIT

bash scripts/copy-tree.sh "$tmp"

# Test tools installed under .cache/ (make check-tools) are ignored by git but
# needed by the copy's browser tests.
if [[ -d .cache ]]; then cp -r .cache "$tmp/"; fi

cd "$tmp"
echo "check-rename: renaming a copy in $tmp to $new"

step="renaming the module"
bash scripts/rename-module.sh "$new" >/dev/null

step="looking for the old module path"
if leftovers=$(grep -rnF --include='*.go' --include='*.yaml' --include='*.yml' --include=go.mod -- "$old" .); then
  echo "check-rename: the old module path is still named in the copy:" >&2
  echo "$leftovers" >&2
  exit 1
fi
step="looking for the old name"
if leftovers=$(grep -rnIE --exclude-dir=.git --exclude-dir=.cache -- "/${old_name}\?|\b${old_name}_[a-z]|\b${old_name}:local|-t ${old_name}\b|--rm ${old_name}\b|\b${old_name}-fake-processor" .); then
  echo "check-rename: the old name $old_name is still spelled as a database, metric, image or User-Agent in the copy:" >&2
  echo "$leftovers" >&2
  exit 1
fi
if ! grep -q "/${new_name}?" internal/config/config.go || ! grep -q "\"${new_name}_http_requests_total\"" internal/metrics/metrics.go; then
  echo "check-rename: the copy's database or metric prefix is not named $new_name" >&2
  exit 1
fi
if [[ $(go list -m) != "$new" ]]; then
  echo "check-rename: go list -m says $(go list -m), want $new" >&2
  exit 1
fi

step="running go build ./... in the copy"
echo "check-rename: go build ./..."
go build ./...

step="running go vet ./... in the copy"
echo "check-rename: go vet ./..."
go vet ./...

step="running go test -count=1 ./... in the copy"
echo "check-rename: go test -count=1 ./..."
go test -count=1 ./...
