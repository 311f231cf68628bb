#!/usr/bin/env bash
# Run the commands of the docs' ```sh blocks (make check-docs), so that a
# walkthrough that names a file, a query or a test fails CI the day it stops
# being true. Each block runs in its own bash, at the repository root, with
# -euo pipefail. Then run the tour (docs/tour.md) against a fresh demo and
# compare what it answers with what the tour shows (check-readme.sh),
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
# docs/learn.md, the reading path: at most eight steps and 2,000 words,
# each step a file that exists, whose "Read `X` and `Y`." line names what
# that file defines (the tests it names are checked below, with every doc's),
# and at most 2,000 words of code to read: each name's definition, with the
# comment above it (a query: its comment and SQL).
learn=docs/learn.md
steps=0 code=0
file=""
# definition FILE NAME prints NAME's definition in FILE, or nothing.
definition() {
  awk -v name="$2" '
    !found && ($0 ~ "^-- name: " name " ") { found = 1 }
    !found && /^\/\/|^-- / { doc = doc $0 "\n"; next }
    !found && ($0 ~ "^(func (\\([^)]*\\) )?|type |var )" name "[^A-Za-z0-9_]") {
      printf "%s%s\n", doc, $0
      if ($0 !~ /[{(]$/) exit # one line
      found = 1; next
    }
    found { print; if ($0 ~ /^[})]$/ || $0 ~ /;$/) exit }
    { doc = "" }
  ' "$1"
}
while IFS= read -r line; do
  if [[ $line =~ ^##\ [0-9]+\..*\]\(\.\./([^\)]+)\)$ ]]; then
    file=${BASH_REMATCH[1]} steps=$((steps + 1))
    [[ -f $file ]] || { echo "check-docs: $learn reads $file, which does not exist" >&2; exit 1; }
  elif [[ $line == Read\ * && -n $file ]]; then
    for name in $(grep -o '`[A-Za-z_][A-Za-z0-9_]*`' <<<"$line" | tr -d '`'); do
      def=$(definition "$file" "$name")
      [[ -n $def ]] || { echo "check-docs: $learn says to read $name in $file, which does not define it" >&2; exit 1; }
      code=$((code + $(wc -w <<<"$def")))
    done
    file=""
  fi
done <"$learn"
if ((code > 2000)); then
  echo "check-docs: $learn sends a reader to $code words of code; at most 2,000" >&2
  exit 1
fi
words=$(wc -w <"$learn")
if ((steps == 0 || steps > 8 || words > 2000)); then
  echo "check-docs: $learn has $steps steps and $words words; it must have 1 to 8, in at most 2,000 words" >&2
  exit 1
fi
echo "check-docs: $learn: $steps steps, $words words, each naming what its file defines, $code words of code"

# Its glossary ("## Words"): at most 20 words, each naming the identifier
# that carries it, which must exist: `Name` (a query, or a Go func, type,
# var, const or field), `pkg.Name` (in internal/pkg) or `Type.Name` (a
# method or field of Type, in a package that defines Type).
defines() { # defines DIR NAME: a non-test Go file in DIR defines NAME
  local files
  mapfile -t files < <(find "$1" -maxdepth 1 -name '*.go' ! -name '*_test.go')
  ((${#files[@]} > 0)) &&
    grep -Eqs "^(func (\([^)]*\) )?$2[[(]|type $2\b|(var|const) $2\b|[[:space:]]+$2[[:space:]])" "${files[@]}"
}
terms=0
while IFS= read -r id; do
  terms=$((terms + 1))
  name=${id##*.} owner=${id%.*} ok=0
  if [[ $id != *.* ]]; then
    grep -qs -- "-- name: $name " db/queries/*.sql && ok=1
    for dir in $(find internal cmd -type d); do defines "$dir" "$name" && ok=1 && break; done
  elif [[ -d internal/$owner ]]; then
    defines "internal/$owner" "$name" && ok=1
  else
    for file in $(grep -rlE --include='*.go' "^type $owner\b" internal); do
      defines "$(dirname "$file")" "$name" && ok=1 && break
    done
  fi
  [[ $ok -eq 1 ]] || { echo "check-docs: $learn's glossary names \`$id\`, which the code does not define" >&2; exit 1; }
done < <(awk '/^## Words/ { on = 1; next } /^## / { on = 0 } on && /^\| [a-z]/ && !/^\| word/' "$learn" |
  cut -d'|' -f3 | tr -d ' `')
((terms > 0 && terms <= 20)) || { echo "check-docs: $learn's glossary has $terms words; it must have 1 to 20" >&2; exit 1; }
echo "check-docs: $learn's glossary: $terms words, each an identifier the code defines"

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
