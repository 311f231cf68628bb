#!/usr/bin/env bash
# check-generated: the generated code is what its sources generate, as the
# working tree has them, committed or not (make check-fast runs it between
# edits). It copies the generated directories aside, regenerates, and
# compares: a file that generation changes, adds or deletes is drift, and a
# hand-written file there (a new migration) is neither. On a clean clone
# (CI) this is the committed code against the committed sources.
set -euo pipefail
dirs=(internal/apigen internal/dbsqlc client/apiclient db/migrations)
before=$(mktemp -d)
trap 'rm -rf "$before"' EXIT
for d in "${dirs[@]}"; do
	mkdir -p "$before/$d"
	cp -a "$d/." "$before/$d/"
done
make --no-print-directory generate >/dev/null
drift=0
for d in "${dirs[@]}"; do
	if ! diff -r "$before/$d" "$d" >"$before/diff" 2>&1; then
		drift=1
		echo "check-generated: $d was not what its sources generate; it is now (review, and commit it with its sources):" >&2
		head -40 "$before/diff" >&2
	fi
done
exit "$drift"
