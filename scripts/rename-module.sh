#!/usr/bin/env bash
# Rename the Go module, and the name the project goes by, for a fork:
# scripts/rename-module.sh NEW_MODULE [NEW_NAME] (or `make rename
# MODULE=NEW_MODULE [NAME=NEW_NAME]`), run at the repository root.
#
# The module: the current path is read from go.mod; `go mod edit -module`
# changes it there, and every other text file that names it (the imports
# of the hand-written and the generated code, strings in tests,
# configuration, documentation) is rewritten with GNU sed.
#
# The name (default: the module's last element, lower case, with - and .
# as _; e.g. shop for example.com/you/shop): the current one, <name>
# below, is read from the default database URL in internal/config/config.go,
# and these spellings of it are rewritten, and nothing else (the word in
# prose, as in "a payments API", is the fork's to reword):
#   - the database: /<name>? in every PostgreSQL URL, and `<name>` database;
#   - the metric prefix: <name>_ (<name>_http_requests_total, and the
#     benchmark's <name>_bench database);
#   - the container image: <name>:local, docker build -t <name>, and
#     docker run --rm <name>;
#   - the fake processor's User-Agent: <name>-fake-processor.
#
# In a git checkout the files are the tracked ones plus untracked files
# that are not ignored; outside git (a copy of the tree) every file below
# the root except .git/. Changed .go files are then run through gofmt -w,
# since a new path can sort differently within an import block.
set -euo pipefail

usage="usage: $0 NEW_MODULE [NEW_NAME]   (for example: $0 example.com/you/shop)"

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "rename-module: expected the new module path, and optionally the new name" >&2
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

# The name: a database name, a metric prefix and an image name at once, so
# lower-case letters and digits, words joined by single underscores.
new_name=${2:-}
if [[ -z $new_name ]]; then
  new_name=${new##*/}
  new_name=${new_name,,}
  new_name=${new_name//[-.~]/_}
fi
if ! [[ $new_name =~ ^[a-z][a-z0-9]*(_[a-z0-9]+)*$ && ${#new_name} -le 40 ]]; then
  echo "rename-module: '$new_name' cannot be the project's name" >&2
  echo "  it names the database, the metrics' prefix and the image: lower-case letters and" >&2
  echo "  digits, starting with a letter, words joined by single underscores, at most 40" >&2
  echo "  characters; pass one as the second argument (NAME=... with make rename)" >&2
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
old_name=$(sed -nE 's|.*DefaultDatabaseURL = "postgres://[^/]*/([a-z0-9_]+)\?.*|\1|p' internal/config/config.go 2>/dev/null || true)
if [[ -z $old_name ]]; then
  echo "rename-module: cannot read the project's name from DefaultDatabaseURL in internal/config/config.go" >&2
  exit 1
fi
if [[ $old == "$new" && $old_name == "$new_name" ]]; then
  echo "rename-module: the module is already $new, and the name $new_name; nothing to do"
  exit 0
fi

# go.mod first: the go command validates the path as well.
if [[ $old != "$new" ]]; then
  go mod edit -module "$new"
fi

# Files to consider, NUL-separated.
list_files() {
  if [[ $(git rev-parse --show-toplevel 2>/dev/null) == "$(pwd -P)" ]]; then
    git ls-files -z --cached --others --exclude-standard
  else
    find . -path ./.git -prune -o \( -type f -o -type l \) -print0
  fi
}

# Of those, the text files (grep -I skips binary files) that name the old
# path or the old name; files listed by git but deleted from the work tree
# are skipped (-s).
mapfile -d '' files < <(list_files | xargs -0 -r grep -lIsZF -e "$old" -e "$old_name" || true)

# Replace the old path only where it is not continued by further name
# characters, so that, say, a sibling module named <old>-extra is left alone.
# Dots in the old path are escaped; the new one is known to be sed-safe.
# The name, only in the spellings listed at the top.
old_re=${old//./\\.}
module_expr="s#${old_re}\([^A-Za-z0-9_~-]\|\$\)#${new}\1#g"
name_exprs=(
  -e "s#/${old_name}?#/${new_name}?#g"
  -e "s#\`${old_name}\` database#\`${new_name}\` database#g"
  -e "s#\b${old_name}_\([a-z]\)#${new_name}_\1#g"
  -e "s#\b${old_name}:local\b#${new_name}:local#g"
  -e "s#docker build -t ${old_name}\b#docker build -t ${new_name}#g"
  -e "s#docker run --rm ${old_name}\b#docker run --rm ${new_name}#g"
  -e "s#\b${old_name}-fake-processor\b#${new_name}-fake-processor#g"
)
exprs=()
[[ $old != "$new" ]] && exprs+=(-e "$module_expr")
[[ $old_name != "$new_name" ]] && exprs+=("${name_exprs[@]}")
changed_go=()
rewrote=0
for f in "${files[@]}"; do
  before=$(cksum <"$f")
  sed -i --follow-symlinks "${exprs[@]}" -- "$f"
  [[ $(cksum <"$f") == "$before" ]] && continue
  rewrote=$((rewrote + 1))
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

echo "rename-module: $old -> $new, name $old_name -> $new_name (go.mod and $rewrote other file(s))"
