#!/usr/bin/env bash
# Rename the Go module, for a fork: scripts/rename-module.sh NEW_MODULE
# (or `make rename MODULE=NEW_MODULE`), run at the repository root.
#
# The current module path is read from go.mod; `go mod edit -module` changes
# it there, and every other text file that names it (the imports of the
# hand-written and the generated code, strings in tests, configuration,
# documentation) is rewritten with GNU sed. In a git checkout the files are
# the tracked ones plus untracked files that are not ignored; outside git
# (a copy of the tree) every file below the root except .git/. Changed .go
# files are then run through gofmt -w, since a new path can sort differently
# within an import block.
set -euo pipefail

usage="usage: $0 NEW_MODULE   (for example: $0 example.com/you/payments)"

if [[ $# -ne 1 ]]; then
  echo "rename-module: expected exactly one argument, the new module path" >&2
  echo "$usage" >&2
  exit 2
fi
new=$1
if [[ -z $new ]]; then
  echo "rename-module: the new module path is empty" >&2
  echo "$usage" >&2
  exit 2
fi

# A module path: a lower-case host-like first element with a dot in it
# (example.com), then path elements of letters, digits and - _ ~ ., none
# empty and none beginning or ending with a dot. Besides being what the go
# command accepts, this keeps the path safe inside a sed expression.
elem='[A-Za-z0-9_~-]+([.][A-Za-z0-9_~-]+)*'
host='[a-z0-9][a-z0-9-]*([.][a-z0-9][a-z0-9-]*)+'
if ! [[ $new =~ ^${host}(/${elem})*$ ]]; then
  echo "rename-module: '$new' is not a valid module path" >&2
  echo "  expected something like example.com/you/payments: a lower-case first" >&2
  echo "  element containing a dot, then /-separated elements of letters, digits" >&2
  echo "  and - _ ~ . (no empty elements, no leading or trailing slash or dot)" >&2
  exit 2
fi

if [[ ! -f go.mod ]]; then
  echo "rename-module: no go.mod here; run this at the repository root" >&2
  exit 2
fi

old=$(awk '$1 == "module" { gsub(/"/, "", $2); print $2; exit }' go.mod)
if [[ -z $old ]]; then
  echo "rename-module: cannot read the module path from go.mod" >&2
  exit 1
fi
if [[ $old == "$new" ]]; then
  echo "rename-module: the module is already $new; nothing to do"
  exit 0
fi

# go.mod first: the go command validates the path as well.
go mod edit -module "$new"

# Files to consider, NUL-separated.
list_files() {
  if [[ $(git rev-parse --show-toplevel 2>/dev/null) == "$(pwd -P)" ]]; then
    git ls-files -z --cached --others --exclude-standard
  else
    find . -path ./.git -prune -o \( -type f -o -type l \) -print0
  fi
}

# Of those, the text files (grep -I skips binary files) that name the old
# path; files listed by git but deleted from the work tree are skipped (-s).
mapfile -d '' files < <(list_files | xargs -0 -r grep -lIsZF -- "$old" || true)

# Replace the old path only where it is not continued by further name
# characters, so that, say, a sibling module named <old>-extra is left alone.
# Dots in the old path are escaped; the new one is known to be sed-safe.
old_re=${old//./\\.}
changed_go=()
for f in "${files[@]}"; do
  sed -i --follow-symlinks -e "s#${old_re}\([^A-Za-z0-9_~-]\|\$\)#${new}\1#g" -- "$f"
  echo "rewrote $f"
  [[ $f == *.go ]] && changed_go+=("$f")
done

if ((${#changed_go[@]})); then
  gofmt -w -- "${changed_go[@]}"
  unformatted=$(gofmt -l -- "${changed_go[@]}")
  if [[ -n $unformatted ]]; then
    echo "rename-module: gofmt -l still lists:" >&2
    echo "$unformatted" >&2
    exit 1
  fi
fi

echo "rename-module: $old -> $new (go.mod and ${#files[@]} other file(s))"
