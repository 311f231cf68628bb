#!/usr/bin/env bash
# A highly available PostgreSQL for development and tests: etcd and three
# Patroni-managed PostgreSQL nodes, on loopback ports, with every file in
# one scratch directory. `make ha` and `make ha STOP=1` use it, and so does
# the failover soak (internal/soak), each with a directory of its own.
#
#   scripts/ha.sh install          install Patroni and etcd (Debian's packages), if missing
#   scripts/ha.sh start DIR        start etcd and the nodes (with a database named payments);
#                                  wait for a leader, a synchronous standby and every node
#                                  streaming; print the DATABASE_URL
#   scripts/ha.sh stop DIR         stop every process started in DIR, by its PID
#   scripts/ha.sh url DIR [DB]     print the DATABASE_URL (every node, target_session_attrs=read-write)
#   scripts/ha.sh node-url DIR NODE [DB]  print a URL of NODE alone (node1, node2, ...)
#   scripts/ha.sh leader DIR       print the leader's name (node1, node2, ...)
#   scripts/ha.sh kill-leader DIR  kill -9 the leader's Patroni and postmaster, wait until both
#                                  are gone, and print its name
#   scripts/ha.sh rejoin DIR NODE  start NODE's Patroni again: it rewinds its data (pg_rewind)
#                                  and follows the leader as a standby
#   scripts/ha.sh wait DIR         wait as start does
#   scripts/ha.sh status DIR       patronictl list
#
# The environment of `start` (kept in DIR/ha.env for the other commands):
#
#   HA_NODES=3          how many PostgreSQL nodes
#   HA_SYNC=on          synchronous replication (synchronous_mode and
#                       synchronous_mode_strict); off: asynchronous, where a
#                       failover may lose acknowledged transactions (the
#                       asynchronous test uses it to show that)
#   HA_PORTS="..."      the ports, in order: etcd's client and peer ports,
#                       then PostgreSQL's and Patroni's REST API's for each
#                       node; unset: free ones, at random below the
#                       kernel's ephemeral range
#   HA_PG_BIN=DIR       PostgreSQL's server binaries (default: the newest
#                       /usr/lib/postgresql/*/bin, or pg_ctl's directory)
#   HA_TIMEOUT=120      seconds to wait for the cluster
#   HA_WATCH_PID=PID    stop the cluster when this process ends (a test
#                       passes its own, so that a killed test leaves
#                       nothing running)
#
# PostgreSQL refuses to run as root: under root, Patroni (and so
# PostgreSQL) runs as the postgres user, which must be able to reach DIR.
# docs/operations.md explains every setting below.
set -euo pipefail

die() { echo "ha.sh: $*" >&2; exit 1; }

if [[ ${1:-} == install ]]; then
  # What the cluster needs, from Debian's packages (.ci/run and make ha
  # run this). Only the packages are installed: nothing is started, and a
  # system etcd that the package may start on 2379 is left alone (this
  # script's clusters use ports of their own).
  if command -v patroni >/dev/null && command -v etcd >/dev/null; then exit 0; fi
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    die "patroni and etcd are needed: install them (Debian: sudo apt-get install patroni etcd-server)"
  fi
  echo "ha.sh: installing patroni and etcd-server"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patroni etcd-server >/dev/null
  exit 0
fi
[[ $# -ge 2 ]] || die "usage: $0 install | start|stop|url|node-url|leader|kill-leader|rejoin|wait|status DIR [NODE]"
cmd=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# Run from the cluster's directory: Patroni, run as postgres, inherits the
# working directory (its worker processes change back into it), and the
# caller's may be closed to postgres (a 0700 temporary copy of the tree,
# as scripts/check-rename.sh makes), which hangs the bootstrap.
cd "$dir"

# as runs a command as the user PostgreSQL runs as. setpriv execs the
# command in place (runuser and su fork), so $! is Patroni's own PID.
as=()
if [[ $(id -u) -eq 0 ]]; then
  as=(setpriv --reuid=postgres --regid=postgres --init-groups --)
fi

# alive: the process exists and has not exited. A killed process whose
# parent (here init, or whatever reaps orphans) has not yet reaped it is a
# zombie, which kill -0 still finds.
alive() {
  [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0 # no /proc: trust kill -0
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}
pidof_file() { [[ -s $1 ]] && head -n1 "$1" || true; }

load_env() {
  [[ -f $dir/ha.env ]] || die "$dir has no cluster (ha.env is missing): run '$0 start $dir' first"
  # shellcheck source=/dev/null
  source "$dir/ha.env"
}

rest_port() { # node number -> its REST API's port
  local ports=($HA_PORTS)
  echo "${ports[$((2 + 2 * ($1 - 1) + 1))]}"
}
pg_port() {
  local ports=($HA_PORTS)
  echo "${ports[$((2 + 2 * ($1 - 1)))]}"
}

# cluster_json prints Patroni's view of the cluster (GET /cluster) from the
# first node that answers.
cluster_json() {
  local n
  for n in $(seq 1 "$HA_NODES"); do
    if curl -fsS --max-time 2 "http://127.0.0.1:$(rest_port "$n")/cluster" 2>/dev/null; then return 0; fi
  done
  return 1
}

# cluster_state prints "ready" when there is a leader, a synchronous standby
# (with HA_SYNC=on) and every node streams from the leader on its timeline;
# otherwise what is missing.
cluster_state() {
  local json
  json=$(cluster_json) || { echo "no Patroni REST API answers"; return; }
  HA_SYNC=$HA_SYNC HA_NODES=$HA_NODES python3 -c '
import json, os, sys
c = json.loads(sys.stdin.read())
members = c.get("members", [])
leaders = [m for m in members if m.get("role") == "leader" and m.get("state") == "running"]
if len(leaders) != 1:
    print("leaders running: %d" % len(leaders)); sys.exit()
tl = leaders[0].get("timeline")
replicas = [m for m in members if m.get("role") != "leader"]
if len(members) != int(os.environ["HA_NODES"]):
    print("members: %d of %s" % (len(members), os.environ["HA_NODES"])); sys.exit()
for m in replicas:
    if m.get("state") not in ("running", "streaming") or not isinstance(m.get("lag"), int) or m.get("timeline") != tl:
        print("%s: %s, lag %s, timeline %s (the leader is on %s)" % (m["name"], m.get("state"), m.get("lag"), m.get("timeline"), tl)); sys.exit()
if os.environ["HA_SYNC"] == "on" and not any(m.get("role") == "sync_standby" for m in replicas):
    print("no synchronous standby yet"); sys.exit()
print("ready")
' <<<"$json"
}

# exited_patroni prints the first node whose Patroni is not running.
exited_patroni() {
  local n
  for n in $(seq 1 "$HA_NODES"); do
    if ! alive "$(pidof_file "$dir/node$n/patroni.pid")"; then echo "node$n"; return; fi
  done
}

wait_ready() {
  local deadline=$((SECONDS + HA_TIMEOUT)) state="" exited=""
  while ((SECONDS < deadline)); do
    state=$(cluster_state)
    [[ $state == ready ]] && return 0
    # A Patroni that exited (a port taken, say) will not come back.
    exited=$(exited_patroni)
    if [[ -n $exited ]]; then
      state="$exited's Patroni has exited"
      break
    fi
    sleep 0.5 # polling Patroni's state
  done
  [[ -n $exited ]] || state="after ${HA_TIMEOUT}s: $state"
  echo "ha.sh: the cluster in $dir is not ready: $state" >&2
  for f in "$dir"/node*/patroni.log; do
    echo "--- $f (last 20 lines)" >&2
    tail -n 20 "$f" >&2 || true
  done
  return 1
}

leader_node() {
  local n
  for n in $(seq 1 "$HA_NODES"); do
    # Patroni answers GET /leader with 200 on the leader only.
    if curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$(rest_port "$n")/leader" 2>/dev/null; then
      echo "node$n"
      return 0
    fi
  done
  return 1
}

url() {
  local hosts="" n
  for n in $(seq 1 "$HA_NODES"); do
    hosts+="${hosts:+,}127.0.0.1:$(pg_port "$n")"
  done
  echo "postgres://postgres@$hosts/${1:-postgres}?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
}

# free_ports prints N free loopback ports, all held open until all are
# chosen, below the kernel's ephemeral range: a port from that range may be
# taken by any outgoing connection before Patroni, seconds later, binds it.
free_ports() {
  python3 -c '
import random, socket, sys
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
socks = []
while len(socks) < int(sys.argv[1]):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(low // 2, low)))
        socks.append(s)
    except OSError:
        s.close()
print(" ".join(str(s.getsockname()[1]) for s in socks))
' "$1"
}

pg_bin() {
  if [[ -n ${HA_PG_BIN:-} ]]; then echo "$HA_PG_BIN"; return; fi
  local newest
  newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n | tail -n1 || true)
  if [[ -n $newest ]]; then echo "$newest"; return; fi
  if command -v pg_ctl >/dev/null; then dirname "$(readlink -f "$(command -v pg_ctl)")"; return; fi
  die "no PostgreSQL server binaries: install PostgreSQL or set HA_PG_BIN"
}

write_node_config() { # node number
  local n=$1 name="node$1" sync_mode=false strict=false
  if [[ $HA_SYNC == on ]]; then sync_mode=true; strict=true; fi
  local lag=0
  # Asynchronous: a standby behind the old leader may still be promoted;
  # that is what makes the mode lose acknowledged transactions.
  if [[ $HA_SYNC != on ]]; then lag=1073741824; fi
  mkdir -p "$dir/$name"
  cat >"$dir/$name/patroni.yml" <<EOF
scope: payments
name: $name
restapi:
  listen: 127.0.0.1:$(rest_port "$n")
  connect_address: 127.0.0.1:$(rest_port "$n")
etcd3:
  hosts: 127.0.0.1:$ETCD_CLIENT_PORT
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 4
    maximum_lag_on_failover: $lag
    synchronous_mode: $sync_mode
    synchronous_mode_strict: $strict
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        synchronous_commit: "on"
        wal_log_hints: "on"
        wal_level: replica
        hot_standby: "on"
        max_connections: 200
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        # A standby retries its primary every second, not five: after a
        # failover it follows the new leader sooner, and with
        # synchronous_mode_strict the new leader takes writes only then.
        wal_retrieve_retry_interval: 1s
  initdb:
    - encoding: UTF8
    - auth: trust
  # The service's database, created before any standby copies the leader,
  # so that every node has it from the start. (A standby that has not yet
  # replayed a later CREATE DATABASE refuses connections to it, and pgx does
  # not go on to the next host after that error.)
  post_init: $dir/post_init.sh
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$(pg_port "$n")
  connect_address: 127.0.0.1:$(pg_port "$n")
  data_dir: $dir/$name/data
  bin_dir: $PG_BIN
  pgpass: $dir/$name/pgpass
  # A new standby copies the leader at once, without waiting for a spread
  # checkpoint.
  basebackup:
    - checkpoint: fast
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: $dir/$name
    listen_addresses: 127.0.0.1
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
log:
  level: INFO
EOF
}

start_node() { # node number
  local name="node$1" pid
  pid=$(pidof_file "$dir/$name/patroni.pid")
  if alive "$pid"; then die "$name's Patroni is running already (PID $pid)"; fi
  "${as[@]}" patroni "$dir/$name/patroni.yml" </dev/null >>"$dir/$name/patroni.log" 2>&1 &
  echo $! >"$dir/$name/patroni.pid"
}

# stop_pid PID WHAT: SIGTERM, then SIGKILL if it has not ended in 20s.
stop_pid() {
  local pid=$1 i
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 200); do
    alive "$pid" || return 0
    sleep 0.1 # waiting for the process to end
  done
  echo "ha.sh: $2 (PID $pid) did not stop on SIGTERM; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

stop_all() {
  local n pid
  [[ -f $dir/ha.env ]] || return 0
  load_env
  # Patroni first: on SIGTERM it stops its PostgreSQL (fast mode) and exits.
  # Waiting for these stops only: after a failed start, etcd and the
  # watcher are this shell's children too.
  local stops=()
  for n in $(seq 1 "$HA_NODES"); do
    stop_pid "$(pidof_file "$dir/node$n/patroni.pid")" "node$n's Patroni" &
    stops+=($!)
  done
  wait "${stops[@]}"
  # A postmaster whose Patroni was killed is stopped as a crash would
  # stop it (SIGQUIT: immediate); it is not needed again.
  for n in $(seq 1 "$HA_NODES"); do
    pid=$(pidof_file "$dir/node$n/data/postmaster.pid")
    if alive "$pid"; then
      kill -QUIT "$pid" 2>/dev/null || true
      stop_pid "$pid" "node$n's postmaster"
    fi
  done
  stop_pid "$(pidof_file "$dir/etcd.pid")" etcd
  stop_pid "$(pidof_file "$dir/watch.pid")" "the watcher"
  rm -f "$dir"/node*/patroni.pid "$dir/etcd.pid" "$dir/watch.pid"
}

case $cmd in
start)
  command -v patroni >/dev/null || die "patroni is not installed (Debian: apt-get install patroni)"
  command -v etcd >/dev/null || die "etcd is not installed (Debian: apt-get install etcd-server)"
  if [[ -f $dir/ha.env ]] && alive "$(pidof_file "$dir/etcd.pid")"; then
    die "a cluster is running in $dir already: '$0 stop $dir' first"
  fi
  HA_NODES=${HA_NODES:-3}
  HA_SYNC=${HA_SYNC:-on}
  HA_TIMEOUT=${HA_TIMEOUT:-120}
  HA_PORTS=${HA_PORTS:-$(free_ports $((2 + 2 * HA_NODES)))}
  PG_BIN=$(pg_bin)
  ports=($HA_PORTS)
  [[ ${#ports[@]} -eq $((2 + 2 * HA_NODES)) ]] || die "HA_PORTS has ${#ports[@]} ports; $((2 + 2 * HA_NODES)) are needed"
  ETCD_CLIENT_PORT=${ports[0]}
  ETCD_PEER_PORT=${ports[1]}
  # A fresh cluster: no data from an earlier one.
  rm -rf "$dir"/node* "$dir/etcd"
  cat >"$dir/ha.env" <<EOF
HA_NODES=$HA_NODES
HA_SYNC=$HA_SYNC
HA_PORTS="$HA_PORTS"
HA_TIMEOUT=$HA_TIMEOUT
PG_BIN=$PG_BIN
ETCD_CLIENT_PORT=$ETCD_CLIENT_PORT
EOF
  if [[ ${#as[@]} -gt 0 ]]; then
    chown postgres: "$dir"
    "${as[@]}" test -w "$dir" || die "the postgres user cannot write to $dir (a directory on the way is closed to it); choose another"
  fi
  if [[ -n ${HA_WATCH_PID:-} ]]; then
    # Stops the cluster when the process that asked for it ends, even if
    # it was killed and its own clean-up never ran.
    # It runs a copy of this script kept in $dir: the tree it came from
    # may be gone by then (a temporary copy, deleted by its test).
    cp "$self" "$dir/ha.sh"
    (
      trap '' HUP
      while kill -0 "$HA_WATCH_PID" 2>/dev/null; do sleep 1; done
      rm -f "$dir/watch.pid"
      bash "$dir/ha.sh" stop "$dir"
    ) </dev/null >>"$dir/watch.log" 2>&1 &
    echo $! >"$dir/watch.pid"
  fi

  etcd --name etcd --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "etcd=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new \
    </dev/null >>"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  printf '#!/bin/sh\nexec "%s/psql" "$1" -qc "CREATE DATABASE payments"\n' "$PG_BIN" >"$dir/post_init.sh"
  chmod 755 "$dir/post_init.sh"
  for n in $(seq 1 "$HA_NODES"); do write_node_config "$n"; done
  if [[ ${#as[@]} -gt 0 ]]; then chown -R postgres: "$dir"/node* "$dir/post_init.sh"; fi
  # The first node bootstraps the cluster (initdb); the others then copy
  # it (pg_basebackup) and follow it.
  start_node 1
  for n in $(seq 2 "$HA_NODES"); do start_node "$n"; done
  load_env
  if ! wait_ready; then
    stop_all
    exit 1
  fi
  url
  ;;
stop)
  stop_all
  ;;
url)
  load_env
  url "${3:-postgres}"
  ;;
node-url)
  load_env
  node=${3:?usage: $0 node-url DIR NODE [DB]}
  echo "postgres://postgres@127.0.0.1:$(pg_port "${node#node}")/${4:-postgres}?sslmode=disable"
  ;;
leader)
  load_env
  leader_node || die "no leader"
  ;;
kill-leader)
  load_env
  node=$(leader_node) || die "no leader to kill"
  patroni_pid=$(pidof_file "$dir/$node/patroni.pid")
  postmaster_pid=$(pidof_file "$dir/$node/data/postmaster.pid")
  kill -KILL "$patroni_pid" "$postmaster_pid"
  # A process blocked in the kernel (on the disk, say) dies only when it
  # leaves it: seen here a second later, while the old leader still took
  # writes. The kill is done when both are gone.
  for _ in $(seq 1 300); do
    alive "$patroni_pid" || alive "$postmaster_pid" || break
    sleep 0.1 # waiting for the kernel to end them
  done
  if alive "$patroni_pid" || alive "$postmaster_pid"; then die "$node's Patroni or PostgreSQL outlived SIGKILL by 30s"; fi
  echo "$node"
  ;;
rejoin)
  load_env
  node=${3:?usage: $0 rejoin DIR NODE}
  [[ -f $dir/$node/patroni.yml ]] || die "no node $node in $dir"
  start_node "${node#node}"
  ;;
wait)
  load_env
  wait_ready
  ;;
status)
  load_env
  patronictl -c "$dir/node1/patroni.yml" list
  ;;
*)
  die "unknown command $cmd"
  ;;
esac
