#!/usr/bin/env bash
# Run the tour (docs/tour.md, the session the README points a newcomer to;
# make check-docs), so that what it shows is what the service does. It
# starts the demo as `make run` does (`server demo`) on a free port and a
# fresh database, runs the commands of every ```console block of the tour
# in order, in one bash (so a variable set in one step is there in the
# next), and compares each command's output with the lines the tour shows
# under it.
#
# What is compared, and what is not:
#   - the output as shown, line for line, once both sides have their ids
#     (ord_..., ch_..., po_...), times, UUIDs, paycli's keys and downstream
#     keys (acme-<26 base32 characters>, derived from a key uuidgen made)
#     replaced by placeholders: those differ on every run;
#   - "…" in the tour stands for anything (a trimmed body, a line left
#     out of paycli's JSON), as a reader would take it;
#   - of the response headers, Date, Content-Length, Vary, X-Request-Id and
#     Connection are left out (the tour says so); every other header
#     must be shown.
# The commands say localhost:8080; they are run against the server started
# here, and paycli is pointed at it with PAYMENTS_URL.
#
# A block preceded by a line `<!-- check-docs: skip ... -->` is not run;
# the comment says why.
#
# CHECK_DOCS_POSTGRES is the PostgreSQL server to make the database on
# (default postgres://postgres@127.0.0.1:5432). CHECK_DOCS_SHOW=1 prints
# every command's output as it came, to update the tour from.
set -euo pipefail
cd "$(dirname "$0")/.."
doc=docs/tour.md

for tool in jq uuidgen psql; do
  command -v "$tool" >/dev/null || {
    echo "check-readme: the tour needs $tool (Debian: apt-get install jq uuid-runtime postgresql-client)" >&2
    exit 1
  }
done

postgres=${CHECK_DOCS_POSTGRES:-postgres://postgres@127.0.0.1:5432}
db="readme_$$_$RANDOM"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-readme.XXXXXX")
start=$SECONDS
server_pid=""

finish() {
  rc=$?
  if [[ -n $server_pid ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  psql -q "$postgres/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  if [[ $rc -ne 0 && -s $tmp/server.log ]]; then
    echo "check-readme: the server's log:" >&2
    tail -n 40 "$tmp/server.log" >&2
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap finish EXIT

# The blocks, as NUL-separated records of "command\x1foutput"; commands
# and outputs are the tour's lines (without the "$ ").
awk '
  /^<!-- check-docs: skip/ { skip = 1; next }
  /^```console[[:space:]]*$/ { if (skip) { skipping = 1; skip = 0; next } inblock = 1; cmd = ""; out = ""; cont = 0; next }
  /^```/ && skipping { skipping = 0; next }
  skipping { next }
  /^```/ && inblock {
    if (cmd != "") printf "%s\037%s%c", cmd, out, 0
    inblock = 0; next
  }
  !inblock { if ($0 !~ /^[[:space:]]*$/) skip = 0; next }
  cont { cmd = cmd "\n" $0; cont = /\\$/; next }
  /^\$ / {
    if (cmd != "") printf "%s\037%s%c", cmd, out, 0
    cmd = substr($0, 3); out = ""; cont = /\\$/; next
  }
  { out = out $0 "\n" }
' "$doc" >"$tmp/steps"

cmds=() outs=()
while IFS= read -r -d '' step; do
  cmds+=("${step%%$'\037'*}")
  outs+=("${step#*$'\037'}")
done <"$tmp/steps"
if [[ ${#cmds[@]} -eq 0 ]]; then
  echo "check-readme: $doc has no console blocks to run" >&2
  exit 1
fi

# The demo, as make run starts it, on a free port and a fresh database
# (the server creates it).
go build -o "$tmp/server" ./cmd/server
DATABASE_URL="$postgres/$db?sslmode=disable&pool_max_conns=20" HTTP_ADDR=127.0.0.1:0 LOG_FORMAT=json \
  "$tmp/server" demo >"$tmp/server.log" 2>&1 &
server_pid=$!
addr=""
deadline=$((SECONDS + 120))
until [[ -n $addr ]] && curl -sf "http://$addr/healthz" >/dev/null 2>&1; do
  if ((SECONDS > deadline)) || ! kill -0 "$server_pid" 2>/dev/null; then
    echo "check-readme: the demo server did not come up" >&2
    exit 1
  fi
  [[ -n $addr ]] || addr=$(jq -r 'select(.msg | startswith("demo: listening")) | .addr' "$tmp/server.log" 2>/dev/null | head -n1)
  sleep 0.2
done

# One script with every command, each followed by a marker line, run by
# one bash at the repository root.
{
  echo "export PAYMENTS_URL=http://$addr"
  for i in "${!cmds[@]}"; do
    printf '%s\n' "${cmds[$i]//localhost:8080/$addr}"
    printf "printf '\\\\n@@check-readme %d@@\\\\n'\n" "$i"
  done
} >"$tmp/session.sh"
session_start=$SECONDS
timeout 600 bash "$tmp/session.sh" >"$tmp/session.out" 2>&1 || {
  echo "check-readme: the session did not finish (exit $?); its output:" >&2
  cat "$tmp/session.out" >&2
  exit 1
}
session_time=$((SECONDS - session_start))

# normalize replaces what differs from run to run with placeholders.
normalize() {
  tr -d '\r' | sed -E \
    -e 's/\b([a-z]+)_[a-z2-7]{24}\b/\1_<id>/g' \
    -e 's/[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(Z|[+-][0-9:]+)/<time>/g' \
    -e 's/\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b/<uuid>/g' \
    -e 's/\bkey=[0-9a-f]{32}\b/key=<key>/g' \
    -e 's/\b([a-z0-9_]+)-[a-z2-7]{26}\b/\1-<downstream key>/g' \
    -e 's/[[:space:]]+$//'
}

# The output of command i, as it came, from the session's output.
awk -v RS='\n@@check-readme [0-9]+@@\n' '{ printf "%s%c", $0, 0 }' "$tmp/session.out" >"$tmp/actual"
actual=()
while IFS= read -r -d '' a; do actual+=("$a"); done <"$tmp/actual"

failed=0
for i in "${!cmds[@]}"; do
  got=$(printf '%s' "${actual[$i]-}" | { grep -Eiv '^(Date|Content-Length|Vary|X-Request-Id|Connection):' || true; } | normalize)
  want=$(printf '%s' "${outs[$i]}" | normalize)
  got=${got%$'\n'} want=${want%$'\n'}
  if [[ ${CHECK_DOCS_SHOW:-} == 1 ]]; then
    printf '$ %s\n%s\n\n' "${cmds[$i]}" "${actual[$i]-}"
  fi
  # The tour's lines as a pattern: everything literal but "…".
  pattern=$(printf '%s' "$want" | sed 's/[][*?\\()|+@!]/\\&/g')
  pattern=${pattern//…/*}
  # shellcheck disable=SC2053 # the right side is a pattern on purpose
  if [[ $got != $pattern ]]; then
    failed=1
    {
      echo "check-readme: $doc shows another output for:"
      echo "  \$ ${cmds[$i]//$'\n'/$'\n'  }"
      echo "  $doc (ids and times as placeholders):"
      printf '%s\n' "$want" | sed 's/^/    | /'
      echo "  the service:"
      printf '%s\n' "$got" | sed 's/^/    | /'
    } >&2
  fi
done
[[ $failed -eq 0 ]] || exit 1
echo "check-readme: OK: ${#cmds[@]} commands of $doc, run against a fresh demo, answered as shown (session ${session_time}s, all $((SECONDS - start))s)"
