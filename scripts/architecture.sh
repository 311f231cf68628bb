#!/usr/bin/env bash
# The map of the packages, drawn from the code: the Mermaid graph of which
# package imports which (from `go list`), and the table of which package
# calls each file of db/queries, for docs/architecture.md.
#
#   bash scripts/architecture.sh          print them
#   bash scripts/architecture.sh --write  put them in docs/architecture.md, and bring its
#                                         table of packages to the tree
#   bash scripts/architecture.sh --check  fail if the doc's map is not the code's,
#                                         if a query file has two owners, or if
#                                         its table of packages misses one
#   bash scripts/architecture.sh --owners only the owners' check (make generate's first step)
#
# Edges to the packages nearly everything uses (apigen, dbsqlc, postgres,
# problem, metrics, config: the generated code and the plumbing) are left
# out, or they would hide the shape; the doc lists them instead. So are the
# packages only tests use (soak, testdb) and the commands that are tools
# (bench, healthcheck, paycli).
set -euo pipefail
cd "$(dirname "$0")/.."

module=$(go list -m)
graph() {
  echo '```mermaid'
  echo 'graph TD'
  go list -f '{{.ImportPath}} {{join .Imports " "}}' ./cmd/... ./internal/... |
    sed "s|$module/||g" |
    awk '
      function skip(p) { return p ~ /^internal\/(apigen|dbsqlc|postgres|problem|metrics|config|soak|testdb)$/ || p ~ /^cmd\/(bench|healthcheck|paycli)$/ }
      function id(p) { gsub("/", "_", p); return p }
      {
        from = $1
        if (skip(from)) next
        printf "1  %s[\"%s\"]\n", id(from), from
        for (i = 2; i <= NF; i++) {
          to = $i
          if (to !~ /^(internal|cmd)\// || skip(to)) continue
          printf "2  %s --> %s\n", id(from), id(to)
        }
      }' |
    LC_ALL=C sort -u | cut -c2-
  echo '```'
}

# owners prints, for each db/queries file, the packages whose non-test code
# calls one of its queries (every package calls them through a variable
# named queries). cmd/bench is allowed a second hand on the tables it
# measures: its floor runs the service's own statements without the
# service around them, which is its point.
callers_of() {
  for q in $(sed -n 's/^-- name: \([A-Za-z0-9]*\).*/\1/p' "$1"); do
    grep -rlE --include='*.go' "\\bqueries\\.$q\\(" cmd internal | grep -v '_test\.go$' | xargs -r -n1 dirname
  done | LC_ALL=C sort -u
}

owners() {
  echo '| Query file | Called by |'
  echo '|---|---|'
  for f in db/queries/*.sql; do
    echo "| \`$f\` | $(callers_of "$f" | sed 's/.*/`&`/' | paste -sd, - | sed 's/,/, /g') |"
  done
}

# check_owners fails when a query file has no owner or more than one. make
# generate runs it first (--owners), before anything is written: the owner's
# calls are found by name, so its code can be written before sqlc generates
# what it calls.
check_owners() {
  local bad=0 n
  for f in db/queries/*.sql; do
    n=$(callers_of "$f" | grep -vc '^cmd/bench$' || true)
    if ((n != 1)); then
      echo "architecture: $f is called from $n packages (not counting tests and cmd/bench); each query file has one owner: write the package that calls its queries (queries.Name(...)) first, then make generate" >&2
      bad=1
    fi
  done
  return $bad
}

# check_table fails when the doc's hand-written table of packages or its
# count of packages and commands is not the tree's: each package under
# internal/ is a row `| \`internal/name\` |`, and no row names a package gone.
check_table() {
  local bad=0 pkg want have
  want=$(find internal -name '*.go' -printf '%h\n' | LC_ALL=C sort -u)
  have=$(sed -n 's/^| `\(internal\/[a-z0-9_/]*\)` |.*/\1/p' "$doc" | LC_ALL=C sort -u)
  for pkg in $(comm -23 <(echo "$want") <(echo "$have")); do
    echo "architecture: $pkg has no row in $doc's table of packages: run make generate (it adds one, from the package's doc comment)" >&2
    bad=1
  done
  for pkg in $(comm -13 <(echo "$want") <(echo "$have")); do
    echo "architecture: $doc's table of packages names $pkg, which does not exist: run make generate (it removes the row)" >&2
    bad=1
  done
  local count="There are $(echo "$want" | wc -l) packages under \`internal/\` and $(find cmd -mindepth 1 -maxdepth 1 -type d | wc -l) commands under \`cmd/\`."
  if ! grep -qF -- "$count" "$doc"; then
    echo "architecture: $doc must say \"$count\": run make generate" >&2
    bad=1
  fi
  return $bad
}

generated() {
  graph
  echo
  owners
}

# write_table brings the doc's table of packages and its count to the tree
# (make generate): a package without a row gets one, from what it owns (its
# query files) and its doc comment's first sentence, for a person to
# improve; a row naming a package gone is removed.
write_table() {
  local want have pkg owns row
  want=$(find internal -name '*.go' -printf '%h\n' | LC_ALL=C sort -u)
  have=$(sed -n 's/^| `\(internal\/[a-z0-9_/]*\)` |.*/\1/p' "$doc" | LC_ALL=C sort -u)
  for pkg in $(comm -13 <(echo "$want") <(echo "$have")); do
    grep -vF -- "| \`$pkg\` |" "$doc" >"$tmp" && cp "$tmp" "$doc"
  done
  for pkg in $(comm -23 <(echo "$want") <(echo "$have")); do
    owns=$(for f in db/queries/*.sql; do
      if callers_of "$f" | grep -qx "$pkg"; then basename "$f" .sql; fi
    done | sed 's/.*/`&`/' | paste -sd, - | sed 's/,/, /g')
    row="| \`$pkg\` | ${owns:-none} | $(go list -f '{{.Doc}}' "./$pkg" 2>/dev/null | sed 's/|/\\|/g') |"
    ROW=$row awk '/^\| `internal\// { last = NR } { lines[NR] = $0 }
      END { for (i = 1; i <= NR; i++) { print lines[i]; if (i == last) print ENVIRON["ROW"] } }' "$doc" >"$tmp" && cp "$tmp" "$doc"
  done
  sed -i "s/^There are [0-9]* packages under \`internal\/\` and [0-9]* commands under \`cmd\/\`\./There are $(echo "$want" | wc -l) packages under \`internal\/\` and $(find cmd -mindepth 1 -maxdepth 1 -type d | wc -l) commands under \`cmd\/\`./" "$doc"
}

begin='<!-- BEGIN scripts/architecture.sh: do not edit; `make generate` writes it -->'
end='<!-- END scripts/architecture.sh -->'
doc=docs/architecture.md
case "${1:-}" in
  --owners)
    check_owners
    ;;
  --write | --check)
    # The doc holds each marker once, on a line of its own; without them
    # there would be nothing to write, and nothing to check.
    for marker in "$begin" "$end"; do
      if [[ $(grep -cxF -- "$marker" "$doc") -ne 1 ]]; then
        echo "architecture: $doc must hold the line '$marker' once" >&2
        exit 1
      fi
    done
    tmp=$(mktemp)
    trap 'rm -f "$tmp"' EXIT
    check_owners
    if [[ $1 == --write ]]; then write_table; else check_table; fi
    awk -v begin="$begin" -v end="$end" -v graph="$(generated)" '
      $0 == begin { print; print graph; skipping = 1; next }
      $0 == end   { skipping = 0 }
      !skipping   { print }' "$doc" >"$tmp"
    if [[ $1 == --check ]]; then
      if ! diff -u "$doc" "$tmp" >&2; then
        echo "architecture: $doc's map is not the code's: run 'make generate' and commit the result" >&2
        exit 1
      fi
    else
      cp "$tmp" "$doc"
    fi
    ;;
  *) generated ;;
esac
