#!/usr/bin/env bash
# Model-check the lease protocol, model/idempotency.pml, with spin (make
# model). Everything it builds goes to .cache/model/, one directory per run:
#
#   safety     every assertion and invariant, in every reachable state:
#              0 errors, and every statement of every process reached (an
#              assertion nobody reaches proves nothing);
#   resumed    liveness under weak fairness: a record nobody holds is taken
#              over (or settled): 0 errors;
#   answered   liveness under weak fairness, with no deadline: a waiter is
#              answered: 0 errors;
#   no-fence   the planted bug (the completion without `attempt = a`): the
#              safety run must FAIL; its counterexample is replayed;
#   no-timer   waiters woken only by NOTIFY: `answered` must FAIL; its
#              counterexample is replayed.
#
# It fails if the model has an error, or if a planted bug goes unnoticed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v spin >/dev/null 2>&1; then
  echo "check-model: spin is not installed (Debian: apt-get install spin)" >&2
  exit 1
fi

# Leases that may lapse under a holder still at work (see the model's
# header). Liveness takes one: stalls must stop some time for anything to
# finish, and one is enough to fence an owner out inside a fair run.
SAFETY_STALLS=2
LIVENESS_STALLS=1

model=model/idempotency.pml
out=.cache/model
rm -rf "$out"
mkdir -p "$out"
TIMEFORMAT='%R s wall, %U s user'

# build DIR CFLAGS -- SPINFLAGS: the verifier for one run, in $out/DIR.
build() {
  local dir=$out/$1 cflags=$2
  shift 3
  mkdir -p "$dir"
  cp "$model" "$dir/"
  (cd "$dir" && spin "$@" -a idempotency.pml >spin-a.log && gcc -w $cflags -o pan pan.c)
}

# summary LOG: the figures of a run.
summary() {
  grep -E 'depth reached|states, stored|transitions \(|total actual memory|elapsed time|acceptance|assertion violated' "$1" |
    sed 's/^[[:space:]]*/    /'
}

# story DIR SPINFLAGS...: replay the trail of the run in DIR, as the
# model's printf lines tell it (spin -t), without the variable dump.
story() {
  local dir=$out/$1
  shift
  (cd "$dir" && spin "$@" -t idempotency.pml) |
    grep -vE '^ltl |^Never claim|^[[:space:]]*$|^[[:space:]]+[a-z_]+(\[[0-9]+\])? = |^[[:space:]]*[0-9]+:[[:space:]]+proc |processes' |
    sed 's/^[[:space:]]*/    /'
}

# run NAME ARGS...: run $out/NAME/pan with ARGS; its output in pan.log.
run() {
  local name=$1
  shift
  echo "check-model: $name"
  { time (cd "$out/$name" && ./pan "$@" >pan.log 2>&1); } 2>"$out/$name/time.log" || true
  summary "$out/$name/pan.log"
  echo "    time: $(cat "$out/$name/time.log")"
}

# clean NAME: the run searched everything it had to and found nothing.
clean() {
  grep -q 'errors: 0$' "$out/$1/pan.log" &&
    ! grep -qE 'Search not completed|max search depth too small|out of memory' "$out/$1/pan.log"
}

# caught NAME: the run found at least one error (and did not just crash).
caught() { grep -qE 'errors: [1-9][0-9]*$' "$out/$1/pan.log"; }

# Build the four verifiers at once (gcc takes about as long as the
# searches). -O1 for the two that search the whole model: -O2 would save
# less search time than it costs to compile. The planted bugs' searches
# are tiny, so theirs are not optimised at all.
build safety "-O1 -DSAFETY -DNOCLAIM" -- -DMAXSTALLS=$SAFETY_STALLS &
b1=$!
build liveness "-O1 -DNFAIR=3" -- -DMAXSTALLS=$LIVENESS_STALLS -DNO_DEADLINE &
b2=$!
build no-fence "-O0 -DSAFETY -DNOCLAIM -DBFS" -- -DMAXSTALLS=$SAFETY_STALLS -DNO_FENCE &
b3=$!
build no-timer "-O0 -DNFAIR=3" -- -DMAXSTALLS=$LIVENESS_STALLS -DNO_DEADLINE -DNO_TIMER &
b4=$!
for b in $b1 $b2 $b3 $b4; do wait $b; done
for claim in resumed answered; do
  mkdir -p "$out/$claim"
  cp "$out/liveness/pan" "$out/liveness/idempotency.pml" "$out/$claim/"
done

# The safety run, and the two liveness runs one after the other, side by
# side (two cores).
run safety -m100000 >"$out/safety.txt" &
r1=$!
{ run resumed -m100000 -a -f -N resumed; run answered -m100000 -a -f -N answered; } >"$out/liveness.txt" &
r2=$!
wait $r1
wait $r2

fail=0

# 1. Safety: no error, and nothing unreached.
cat "$out/safety.txt"
if ! clean safety; then
  echo "check-model: the safety run found an error:" >&2
  story safety -DMAXSTALLS=$SAFETY_STALLS >&2
  fail=1
fi
# pan lists the statements no run reached, per process; only each
# process's end may be missing (the loops never end).
unreached=$(awk '/^unreached in claim/ { skip = 1 } /^unreached in (proctype|init)/ { skip = 0 }
  !skip && /idempotency\.pml:/ && !/"-end-"/' "$out/safety/pan.log")
if [[ -n $unreached ]]; then
  echo "check-model: statements the safety run never reached:" >&2
  echo "$unreached" >&2
  fail=1
else
  echo "    every statement of every process was reached"
fi

# 2. Liveness, under weak fairness, without the waiters' deadline.
cat "$out/liveness.txt"
for claim in resumed answered; do
  if ! clean "$claim"; then
    echo "check-model: liveness ($claim) fails:" >&2
    story "$claim" -DMAXSTALLS=$LIVENESS_STALLS -DNO_DEADLINE >&2
    fail=1
  fi
done

# 3. The planted bug, breadth-first: the counterexample is a shortest one.
run no-fence
if ! caught no-fence; then
  echo "check-model: NO_FENCE was not caught: the safety properties are too weak" >&2
  fail=1
else
  echo "    caught, as it must be; the counterexample:"
  story no-fence -DMAXSTALLS=$SAFETY_STALLS -DNO_FENCE
fi

# 4. Waiters without their timer (-i: pan keeps looking for a shorter
#    trail).
run no-timer -m100000 -a -f -N answered -i
if ! caught no-timer; then
  echo "check-model: NO_TIMER was not caught: the liveness property is too weak" >&2
  fail=1
else
  echo "    caught, as it must be; the counterexample (the waiter then waits for ever):"
  story no-timer -DMAXSTALLS=$LIVENESS_STALLS -DNO_DEADLINE -DNO_TIMER
fi

if [[ $fail != 0 ]]; then
  exit 1
fi
echo "check-model: OK"
