#!/usr/bin/env bash
# pinflow's distributed deployment on this machine, all on 127.0.0.1 and in
# one directory: a private PostgreSQL, two Temporal server nodes on it (each
# runs frontend, history, matching and worker), a Redis Cluster of three
# masters with a replica each for the ledgers, a standalone Redis for the
# simulated hypervisors (a ledger failover must not lose a simulated guest)
# and pinflow workers. The config templates are in deploy/cluster/.
#
#   deploy/cluster.sh up | down [--purge] | status
#   deploy/cluster.sh kill|stop|start  temporal N | redis PORT | worker N
#
# up starts what is not running and waits until all of it is usable; kill
# is kill -9, stop is SIGTERM and wait, start (re)starts one process and
# waits until it is ready. Environment: PINFLOW_CLUSTER_DIR (the state dir,
# ${TMPDIR:-/tmp}/pinflow-cluster), PINFLOW_CLUSTER_BASE_PORT (17000),
# PINFLOW_CLUSTER_WORKERS (3), PINFLOW_WORKER_BIN, TEMPORAL_SERVER_BIN,
# TEMPORAL_SQL_BIN, TEMPORAL_CLI_BIN. Ports, from the base B:
#   B          PostgreSQL
#   B+10..19   Temporal node 1: frontend gRPC, frontend HTTP, history,
#              matching, worker, their 4 membership ports, metrics
#   B+20..29   Temporal node 2, the same
#   B+40+N     worker N's health endpoint (/livez, /readyz)
#   B+100..105 the Redis Cluster (bus ports B+110..115)
#   B+106      the simulator's Redis
# shellcheck disable=SC2015 # "a && b || die" is meant: it dies when either fails
set -euo pipefail
set +m # without job control a background process is no group leader, so setsid keeps its pid
cd "$(dirname "$0")/.."
root=$PWD

state=${PINFLOW_CLUSTER_DIR:-${TMPDIR:-/tmp}/pinflow-cluster}
workers=${PINFLOW_CLUSTER_WORKERS:-3}
worker_bin=${PINFLOW_WORKER_BIN:-$root/bin/pinflow-worker}
server_bin=${TEMPORAL_SERVER_BIN:-$root/bin/temporal-server}
sql_bin=${TEMPORAL_SQL_BIN:-$root/bin/temporal-sql-tool}
cli_bin=${TEMPORAL_CLI_BIN:-$root/bin/temporal}
[ -n "${TEMPORAL_CLI_BIN:-}" ] || [ -x "$cli_bin" ] || cli_bin=$(command -v temporal || echo "$cli_bin")
temporal_version=${TEMPORAL_SERVER_VERSION:-v1.29.1} # of the server and its schema files
shards=64                # fixed when the database is made
namespace=default
# pinflow's custom search attributes, as api.SearchAttributes() lists them
search_attrs="PinflowInstance=Keyword PinflowOperation=Keyword PinflowSourceHost=Keyword PinflowDestHost=Keyword PinflowPhase=Keyword PinflowFreed=Int PinflowDrift=Int"
marker=.pinflow-cluster # written by up; down --purge deletes only a dir that has it

die() { echo "cluster: $*" >&2; exit 1; }
usage() { echo "usage: deploy/cluster.sh up | down [--purge] | status | kill|stop|start temporal N|redis PORT|worker N" >&2; exit 2; }

case $state in /*) ;; *) state=$PWD/$state ;; esac
case $state in *[[:space:]]*) die "PINFLOW_CLUSTER_DIR $state: no spaces allowed" ;; esac
stored=$(cat "$state/base_port" 2>/dev/null || true)
base=${PINFLOW_CLUSTER_BASE_PORT:-${stored:-17000}}
[[ $base =~ ^[0-9]+$ ]] && [ "$base" -ge 1024 ] && [ "$base" -le 32640 ] ||
  die "PINFLOW_CLUSTER_BASE_PORT $base: allowed are 1024 to 32640 (every port stays below 32768)"
[ -z "$stored" ] || [ "$stored" = "$base" ] || die "$state was made with base port $stored, not $base"
[[ $workers =~ ^[0-9]+$ ]] && [ "$workers" -le 50 ] || die "PINFLOW_CLUSTER_WORKERS $workers: allowed are 0 to 50"

pgdir=$state/postgres
node_port() { echo $((base + 10 * $1)); }
worker_port() { echo $((base + 40 + $1)); }
redis_ports=$(seq -s " " $((base + 100)) $((base + 105)))
sim_port=$((base + 106))
join() { local IFS=,; echo "$*"; }

t0=$EPOCHREALTIME
took() { awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }
busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# A zombie has no command line; a pid file can outlive its process and the
# pid be reused, so a process counts as ours only if it names what we gave it.
alive() { # pidfile needle...: its pid runs, and its command line or environment has every needle
  local pid id n
  pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] || return 1
  id=" $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/environ") " || return 1
  shift
  for n; do [[ $id == *" $n "* ]] || return 1; done
}
gone() { [[ ! -e /proc/$1 || "$(cat "/proc/$1/stat" 2>/dev/null)" =~ ^[0-9]+\ \(.*\)\ [ZX] ]]; }
wait_for() { # seconds what command...
  local end=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "timed out waiting for $what; logs are in $state"
    sleep 0.2
  done
}

# ---- PostgreSQL, run as the postgres user: initdb refuses root
pg_bin=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_pg() { (cd / && if [ "$EUID" -eq 0 ]; then exec runuser -u postgres -- "$@"; else exec "$@"; fi); }
psql_() { "$pg_bin/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$pgdir" -p "$base" -U postgres "$@"; }
pg_enters() { [ "$EUID" -ne 0 ] || runuser -u postgres -- test -x "$1"; }
pg_alive() { [ -f "$pgdir/data/postmaster.pid" ] && as_pg "$pg_bin/pg_ctl" -D "$pgdir/data" status >/dev/null 2>&1; }

start_postgres() {
  [ -x "$pg_bin/initdb" ] || die "no PostgreSQL server in /usr/lib/postgresql/*/bin; run deploy/deps.sh"
  if [ ! -s "$pgdir/data/PG_VERSION" ]; then
    mkdir -p "$pgdir"
    [ "$EUID" -ne 0 ] || chown postgres: "$pgdir"
    chmod 700 "$pgdir"
    # trust on the socket: it is in $pgdir, which only its owner can enter
    as_pg "$pg_bin/initdb" -D "$pgdir/data" -U postgres -E UTF8 --locale=C.UTF-8 \
      --auth-local=trust --auth-host=scram-sha-256 >"$pgdir/initdb.log" 2>&1 ||
      die "initdb failed; see $pgdir/initdb.log"
  fi
  if ! pg_alive; then
    busy "$base" && die "port $base (PostgreSQL) is in use by another program"
    as_pg "$pg_bin/pg_ctl" -D "$pgdir/data" -l "$pgdir/postgres.log" -w -t 60 \
      -o "-p $base -k $pgdir -c listen_addresses=127.0.0.1 -c max_connections=200" start </dev/null >/dev/null ||
      die "PostgreSQL did not start; see $pgdir/postgres.log"
  fi
  psql_ -d postgres -c "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'temporal') THEN
    CREATE ROLE temporal LOGIN CREATEDB PASSWORD 'temporal'; END IF; END \$\$"
}

# Makes both databases at their first start, then brings their schemas to
# this server version's (a no-op when they are there).
load_schema() {
  local tool=("$sql_bin" --plugin postgres12 --ep 127.0.0.1 -p "$base" -u temporal --pw temporal)
  local src db kind dir log=$state/schema.log
  src=$(go env GOMODCACHE 2>/dev/null)/go.temporal.io/server@$temporal_version
  for db in temporal temporal_visibility; do
    kind=${db#temporal_}
    if [ "$(psql_ -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]; then
      "${tool[@]}" --db $db create-database >>"$log" 2>&1 || die "creating database $db failed; see $log"
    fi
    if [ "$(psql_ -d $db -c "SELECT to_regclass('schema_version') IS NOT NULL")" != t ]; then
      "${tool[@]}" --db $db setup-schema -v 0.0 >>"$log" 2>&1 || die "setting up the schema of $db failed; see $log"
    fi
    dir=$src/schema/postgresql/v12/$kind/versioned
    if [ -d "$dir" ]; then
      "${tool[@]}" --db $db update-schema -d "$dir" >>"$log" 2>&1 || die "updating the schema of $db failed; see $log"
    else # without the module source, the copies built into the tool
      "${tool[@]}" --db $db update-schema --schema-name "postgresql/v12/$kind" >>"$log" 2>&1 ||
        die "updating the schema of $db failed; see $log"
    fi
  done
}

# ---- Temporal nodes
temporal_alive() { alive "$state/temporal-$1/server.pid" "--root $state" "TC_NODE_PORT=$(node_port "$1")"; }

start_node() {
  local n=$1 d=$state/temporal-$1 p q
  p=$(node_port "$n")
  temporal_alive "$n" && return 0
  for q in $(seq "$p" $((p + 9))); do busy "$q" && die "port $q (Temporal node $n) is in use by another program"; done
  mkdir -p "$d"
  date -u '+%F %T' >"$d/started" # what the membership check compares with
  (
    export TC_NODE_PORT=$p TC_PG_ADDR=127.0.0.1:$base TC_CLUSTER_RPC=127.0.0.1:$((base + 10)) \
      TC_SHARDS=$shards TC_LOG_LEVEL=${TC_LOG_LEVEL:-warn} TC_DYNAMIC_CONFIG=$state/config/dynamicconfig.yaml
    cd "$state"
    # its own session: a Ctrl-C meant for the caller must not reach the node
    exec setsid "$server_bin" --root "$state" --config config --env temporal --allow-no-auth start \
      >>"$d/server.log" 2>&1 </dev/null
  ) &
  echo $! >"$d/server.pid"
}

serving() {
  local out
  out=$("$cli_bin" operator cluster health --address "$1" --command-timeout 2s 2>&1) && [[ $out == SERVING* ]]
}
# Every service of node $1 has a membership row from its current run,
# heartbeated within the server's own 20 s liveness window.
joined() {
  local p
  p=$(node_port "$1")
  [ "$(psql_ -d temporal -c "SELECT count(DISTINCT role) FROM cluster_membership
    WHERE rpc_port BETWEEN $((p + 5)) AND $((p + 8)) AND session_start >= '$(cat "$state/temporal-$1/started")'
      AND last_heartbeat > (now() AT TIME ZONE 'UTC') - interval '20 seconds'")" = 4 ]
}
tctl() { # frontend command...
  local f=$1
  shift
  "$cli_bin" "$@" --address "$f" -n "$namespace" --command-timeout 5s
}
register() { # namespace and search attributes through frontend $1, what is missing
  local have a missing=()
  tctl "$1" operator namespace describe >/dev/null 2>&1 || tctl "$1" operator namespace create >/dev/null || return 1
  have=$(tctl "$1" operator search-attribute list) || return 1
  for a in $search_attrs; do
    [[ $have == *" ${a%=*} "* ]] || missing+=(--name "${a%=*}" --type "${a#*=}")
  done
  [ ${#missing[@]} -eq 0 ] || tctl "$1" operator search-attribute create "${missing[@]}" >/dev/null
}
# A new namespace reaches each frontend's cache a few seconds later: usable
# means a made-up workflow is "not found" there, and a list query naming
# every attribute is accepted.
usable() {
  local out q="" a
  out=$(tctl "$1" workflow describe -w "pinflow-cluster-probe-$RANDOM" 2>&1) && return 1
  [[ $out == *"not found"* ]] || return 1
  for a in $search_attrs; do
    if [ "${a#*=}" = Int ]; then q="${q:+$q OR }${a%=*} = 0"; else q="${q:+$q OR }${a%=*} = 'probe'"; fi
  done
  tctl "$1" workflow list --query "$q" --limit 1 >/dev/null
}
# The pid start_node records is, for a moment, the subshell that has yet
# to exec the server: done once it is the server, or gone.
exec_done() { temporal_alive "$1" || gone "$(cat "$state/temporal-$1/server.pid")"; }
node_ready() { # n: waits for the node, then for the namespace through it
  local n=$1 f
  f=127.0.0.1:$(node_port "$n")
  wait_for 30 "Temporal node $n's process to start" exec_done "$n"
  temporal_alive "$n" || { tail -n 5 "$state/temporal-$n/server.log" >&2; die "Temporal node $n exited; see $state/temporal-$n/server.log"; }
  wait_for 120 "Temporal node $n's frontend $f SERVING" serving "$f"
  wait_for 60 "Temporal node $n's services joining the membership" joined "$n"
}

# ---- Redis
redis_alive() { alive "$state/redis-$1/redis.pid" "127.0.0.1:$1"; }
start_redis() {
  local p=$1 d=$state/redis-$1
  redis_alive "$p" && return 0
  busy "$p" && die "port $p (Redis) is in use by another program"
  mkdir -p "$d"
  if [ "$p" = "$sim_port" ]; then # a single server, fsynced on every write like the dev stack's
    redis-server --port "$p" --bind 127.0.0.1 --dir "$d" --appendonly yes --appendfsync always --save "" \
      --daemonize yes --pidfile "$d/redis.pid" --logfile "$d/redis.log"
  else
    busy $((p + 10)) && die "port $((p + 10)) (Redis cluster bus of $p) is in use by another program"
    redis-server "$state/config/redis.conf" --port "$p" --cluster-port $((p + 10)) --dir "$d" \
      --pidfile "$d/redis.pid" --logfile "$d/redis.log"
  fi </dev/null >/dev/null 2>&1 || die "redis-server on port $p did not start; see $d/redis.log"
  for _ in $(seq 1 50); do redis_alive "$p" && return 0; sleep 0.1; done
  die "redis-server on port $p did not start; see $d/redis.log"
}
rcli() { redis-cli -p "$1" "${@:2}" 2>/dev/null; }
# Answers, sees every slot served, and as a replica has its master's data
# (the ledger's WAIT 1 counts only replicas that are linked).
redis_ready() {
  local info
  [ "$(rcli "$1" ping)" = PONG ] || return 1
  [ "$1" != "$sim_port" ] || return 0
  info=$(rcli "$1" cluster info) && [[ $info == *cluster_state:ok* && $info == *cluster_slots_ok:16384* ]] || return 1
  info=$(rcli "$1" info replication) && [[ $info != *role:slave* || $info == *master_link_status:up* ]]
}
# A killed master started again before its replica took over would make
# the replica copy its append-only file, up to a second behind what WAIT 1
# acknowledged: so it waits until no live peer counts it a master that has
# a live replica.
failed_over() {
  local q nodes="" id
  for q in $redis_ports; do [ "$q" = "$1" ] || nodes=$(rcli "$q" cluster nodes) && [ -n "$nodes" ] && break; done
  id=$(awk -v a="127.0.0.1:$1@" 'index($2, a) == 1 && $3 ~ /master/ && NF > 8 { print $1 }' <<<"$nodes")
  [ -z "$id" ] || ! awk -v m="$id" '$4 == m && $3 !~ /fail/ { f = 1 } END { exit !f }' <<<"$nodes"
}
create_cluster() { # once: when no node has slots yet and none knows another
  local p info fresh=0 addrs=()
  for p in $redis_ports; do
    info=$(rcli "$p" cluster info) || die "Redis on port $p does not answer"
    [[ $info == *cluster_slots_assigned:16384* ]] && return 0
    [[ $info == *cluster_known_nodes:1$'\r'* ]] && fresh=$((fresh + 1))
    addrs+=("127.0.0.1:$p")
  done
  [ $fresh = 6 ] || die "the Redis nodes in $state are half set up; run down --purge and up"
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >>"$state/redis-create.log" 2>&1 ||
    die "redis-cli --cluster create failed; see $state/redis-create.log"
}

# ---- workers
worker_alive() { alive "$state/worker-$1/worker.pid" "PINFLOW_CLUSTER_DIR=$state" "PINFLOW_HEALTH_ADDR=127.0.0.1:$(worker_port "$1")"; }
start_workers() { # n...: starts them, then checks each still runs a second later
  local n d p launched=0
  for n; do
    d=$state/worker-$n p=$(worker_port "$n")
    worker_alive "$n" && continue
    launched=1
    [ -x "$worker_bin" ] || die "no worker at $worker_bin; run make build"
    [ -f "$state/cluster.env" ] || die "no $state/cluster.env; run up first"
    busy "$p" && die "port $p (worker $n's health endpoint) is in use by another program"
    mkdir -p "$d"
    (
      # shellcheck source=/dev/null
      set -a && . "$state/cluster.env" && set +a
      unset PINFLOW_REDIS_URL # the ledger refuses a URL and cluster addresses together
      export PINFLOW_HEALTH_ADDR=127.0.0.1:$p PINFLOW_METRICS_ADDR=
      exec setsid "$worker_bin" >>"$d/worker.log" 2>&1 </dev/null
    ) &
    echo $! >"$d/worker.pid"
  done
  [ $launched = 0 ] || sleep 1
  for n; do
    worker_alive "$n" || { tail -n 5 "$state/worker-$n/worker.log" >&2; die "worker $n exited; see $state/worker-$n/worker.log"; }
  done
}

# ---- one process
declare -A pidname=([temporal]=server [redis]=redis [worker]=worker)
halt() { # kind which signal seconds: signals the process and waits until it is gone
  local f=$state/$1-$2/${pidname[$1]}.pid pid end
  if "${1}_alive" "$2"; then
    pid=$(cat "$f")
    kill -"$3" "$pid" 2>/dev/null || true
    end=$((SECONDS + $4))
    until gone "$pid"; do
      if [ $SECONDS -ge $end ]; then
        echo "cluster: $1 $2 (pid $pid) still runs after $4 s; kill -9" >&2
        kill -KILL "$pid" 2>/dev/null || true
        end=$((SECONDS + 10))
      fi
      sleep 0.1
    done
  fi
  rm -f "$f"
}
check_which() {
  case $1 in
    temporal) [[ $2 =~ ^[12]$ ]] || die "no Temporal node $2: the nodes are 1 and 2" ;;
    redis) [[ " $redis_ports $sim_port " == *" $2 "* ]] ||
      die "no Redis on port $2: the ports are $redis_ports and $sim_port (the simulator's)" ;;
    worker) [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 50 ] || die "no worker $2: workers are 1 to 50" ;;
    *) usage ;;
  esac
  [ -f "$state/$marker" ] || die "no cluster in $state; run up first"
}

start_one() {
  case $1 in
    temporal)
      pg_alive || die "PostgreSQL of $state is not running; run up"
      start_node "$2"
      node_ready "$2"
      wait_for 60 "namespace $namespace usable through node $2" usable "127.0.0.1:$(node_port "$2")" ;;
    redis)
      if [ "$2" != "$sim_port" ]; then
        [ -f "$state/redis-$2/nodes.conf" ] || die "Redis $2 was never part of the cluster; run up"
        redis_alive "$2" || wait_for 30 "the failover away from Redis $2" failed_over "$2"
      fi
      start_redis "$2"
      wait_for 60 "Redis on port $2 ready in the cluster" redis_ready "$2" ;;
    worker) start_workers "$2" ;;
  esac
}

# ---- the whole deployment
up() {
  local n p f addrs=() fronts=()
  for f in "$server_bin" "$sql_bin" "$cli_bin"; do
    [ -x "$f" ] || command -v "$f" >/dev/null || die "missing $f; run deploy/deps.sh"
  done
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || die "missing redis-server or redis-cli; run deploy/deps.sh"
  [ "$workers" = 0 ] || [ -x "$worker_bin" ] || die "no worker at $worker_bin; run make build (or PINFLOW_CLUSTER_WORKERS=0)"
  [ ! -e "$state" ] || [ -f "$state/$marker" ] || [ -z "$(ls -A "$state")" ] ||
    die "$state is not empty and was not made by deploy/cluster.sh; choose another PINFLOW_CLUSTER_DIR"
  local a=$state
  until [ -e "$a" ]; do a=$(dirname "$a"); done
  pg_enters "$a" && mkdir -p "$state/config" && pg_enters "$state" ||
    die "the postgres user cannot enter $state; set PINFLOW_CLUSTER_DIR to a directory it can (e.g. under /tmp)"
  [ ${#pgdir} -lt 90 ] || die "PINFLOW_CLUSTER_DIR $state is too long for PostgreSQL's socket path"
  touch "$state/$marker"
  echo "$base" >"$state/base_port"
  cp deploy/cluster/temporal.yaml deploy/cluster/redis.conf "$state/config/"
  [ -f "$state/config/dynamicconfig.yaml" ] || cp deploy/cluster/dynamicconfig.yaml "$state/config/"

  start_postgres
  load_schema
  echo "cluster: PostgreSQL on 127.0.0.1:$base ($(took))"
  # Node 1 first: on a new database the first node writes the cluster's
  # metadata and system namespace, and a second node racing it can exit.
  # Redis comes up while node 1 starts.
  start_node 1
  for p in $redis_ports $sim_port; do start_redis "$p"; done
  create_cluster
  node_ready 1
  start_node 2
  node_ready 2
  wait_for 60 "namespace $namespace and the search attributes registered" register "127.0.0.1:$(node_port 1)"
  for n in 1 2; do
    fronts+=("127.0.0.1:$(node_port "$n")")
    wait_for 60 "namespace $namespace usable through node $n" usable "127.0.0.1:$(node_port "$n")"
  done
  echo "cluster: Temporal nodes on ${fronts[*]} ($(took))"
  for p in $redis_ports; do
    addrs+=("127.0.0.1:$p")
    wait_for 60 "Redis on port $p ready in the cluster" redis_ready "$p"
  done
  wait_for 10 "the simulator's Redis on port $sim_port answering" redis_ready "$sim_port"
  echo "cluster: Redis Cluster on $redis_ports ($(took))"

  cat >"$state/cluster.env.new" <<EOF
# Written by deploy/cluster.sh up: how to reach this deployment.
PINFLOW_TEMPORAL_ADDRESS=$(join "${fronts[@]}")
PINFLOW_TEMPORAL_NAMESPACE=$namespace
PINFLOW_REDIS_ADDRS=$(join "${addrs[@]}")
PINFLOW_REDIS_WAIT_REPLICAS=1
PINFLOW_SIM_REDIS_URL=redis://127.0.0.1:$sim_port/0
PINFLOW_DRIVER=sim
PINFLOW_CLUSTER_DIR=$state
PINFLOW_CLUSTER_TEMPORAL_1=${fronts[0]}
PINFLOW_CLUSTER_TEMPORAL_2=${fronts[1]}
PINFLOW_CLUSTER_REDIS_PORTS=${redis_ports// /,}
PINFLOW_CLUSTER_POSTGRES=127.0.0.1:$base
EOF
  mv "$state/cluster.env.new" "$state/cluster.env"
  # shellcheck disable=SC2046 # one number a word
  start_workers $(seq 1 "$workers")
  [ "$workers" = 0 ] || echo "cluster: workers 1 to $workers ($(took))"
  echo "cluster: up in $(took); state and logs in $state. To use it:"
  echo "  set -a; . $state/cluster.env; set +a; bin/pinflow host list"
}

down() {
  local d n
  [ -d "$state" ] || { echo "cluster: nothing in $state"; return 0; }
  [ "${1:-}" != --purge ] || [ -f "$state/$marker" ] || die "$state was not made by deploy/cluster.sh; not deleting it"
  # workers first, while Temporal and Redis take their last calls; then
  # Temporal, which needs PostgreSQL to the end
  for d in "$state"/worker-*/; do [ -d "$d" ] && { n=${d%/}; halt worker "${n##*-}" TERM 90 & }; done
  wait
  for n in 1 2; do halt temporal "$n" TERM 30 & done
  wait
  for n in $redis_ports $sim_port; do halt redis "$n" TERM 30 & done
  wait
  if pg_alive; then as_pg "$pg_bin/pg_ctl" -D "$pgdir/data" -m fast -w -t 60 stop >/dev/null; fi
  if [ "${1:-}" = --purge ]; then
    rm -rf -- "$state"
    echo "cluster: stopped and deleted $state ($(took))"
  else
    echo "cluster: stopped, state kept in $state ($(took))"
  fi
}

status() {
  local n p d role pid
  line() { printf '%-12s %-8s %s\n' "$1" "${2:--}" "$3"; }
  if pg_alive; then line postgres "$(head -n 1 "$pgdir/data/postmaster.pid")" running; else line postgres - stopped; fi
  for n in 1 2; do
    if temporal_alive "$n"; then line "temporal-$n" "$(cat "$state/temporal-$n/server.pid")" "running 127.0.0.1:$(node_port "$n")"
    else line "temporal-$n" - stopped; fi
  done
  for p in $redis_ports $sim_port; do
    role=simulator
    if [ "$p" != "$sim_port" ]; then role=$(rcli "$p" role | head -n 1 || true); fi
    if redis_alive "$p"; then line "redis-$p" "$(cat "$state/redis-$p/redis.pid")" "running ${role/slave/replica}"
    else line "redis-$p" - stopped; fi
  done
  for n in $({
    seq 1 "$workers"
    for d in "$state"/worker-*/; do [ -d "$d" ] && d=${d%/} && echo "${d##*-}"; done
  } | sort -nu); do
    if worker_alive "$n"; then pid=$(cat "$state/worker-$n/worker.pid"); line "worker-$n" "$pid" running
    else line "worker-$n" - stopped; fi
  done
}

case "${1:-}" in
  up) [ $# = 1 ] || usage; up ;;
  down) [ $# = 1 ] || { [ $# = 2 ] && [ "$2" = --purge ]; } || usage; down "${2:-}" ;;
  status) [ $# = 1 ] || usage; status ;;
  kill | stop | start)
    [ $# = 3 ] || usage
    check_which "$2" "$3"
    case $1 in
      kill) halt "$2" "$3" KILL 10 ;;
      stop) halt "$2" "$3" TERM "$([ "$2" = worker ] && echo 90 || echo 30)" ;;
      start) start_one "$2" "$3" ;;
    esac
    echo "cluster: $1 $2 $3 done ($(took))" ;;
  *) usage ;;
esac
