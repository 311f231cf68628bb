#!/usr/bin/env bash
# The map of the packages, drawn from `go list`: prints the Mermaid graph of
# which package imports which, for docs/architecture.md.
#
#   bash scripts/architecture.sh          print the graph
#   bash scripts/architecture.sh --write  put it in docs/architecture.md
#   bash scripts/architecture.sh --check  fail if the doc's graph is not the code's
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

begin='<!-- BEGIN scripts/architecture.sh: do not edit; `make architecture` writes it -->'
end='<!-- END scripts/architecture.sh -->'
doc=docs/architecture.md
case "${1:-}" in
  --write | --check)
    tmp=$(mktemp)
    trap 'rm -f "$tmp"' EXIT
    awk -v begin="$begin" -v end="$end" -v graph="$(graph)" '
      $0 == begin { print; print graph; skipping = 1; next }
      $0 == end   { skipping = 0 }
      !skipping   { print }' "$doc" >"$tmp"
    if [[ $1 == --check ]]; then
      if ! diff -u "$doc" "$tmp" >&2; then
        echo "architecture: $doc's graph is not the code's: run 'make architecture' and commit the result" >&2
        exit 1
      fi
    else
      cp "$tmp" "$doc"
    fi
    ;;
  *) graph ;;
esac
