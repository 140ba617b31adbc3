#!/usr/bin/env bash
# A pinflow dev stack on this machine, in the background: redis-server (with
# an append-only file fsynced on every write, so kill -9 loses no
# acknowledged claim), the Temporal dev server (with the Web UI and
# pinflow's search attributes) and one pinflow worker with the simulated
# hypervisor. State and logs live in one directory.
#
#   deploy/devstack.sh up | down | status
#
# Ports and paths can be overridden: PINFLOW_STATE_DIR (.state),
# PINFLOW_REDIS_PORT (6379), PINFLOW_TEMPORAL_PORT (7233),
# PINFLOW_UI_PORT (8233). The pinflow CLI's defaults reach the default ports.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
state=${PINFLOW_STATE_DIR:-$root/.state}
redis_port=${PINFLOW_REDIS_PORT:-6379}
temporal_port=${PINFLOW_TEMPORAL_PORT:-7233}
ui_port=${PINFLOW_UI_PORT:-8233}
temporal=$(command -v temporal || echo "$root/bin/temporal")

export PINFLOW_REDIS_URL=${PINFLOW_REDIS_URL:-redis://127.0.0.1:$redis_port/0}
export PINFLOW_TEMPORAL_ADDRESS=${PINFLOW_TEMPORAL_ADDRESS:-127.0.0.1:$temporal_port}

running() { [ -f "$state/$1.pid" ] && kill -0 "$(cat "$state/$1.pid")" 2>/dev/null; }

wait_for() { # what, command...
  local what=$1; shift
  for _ in $(seq 1 150); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "devstack: $what did not come up; see $state/*.log" >&2
  exit 1
}

up() {
  mkdir -p "$state"
  if ! running redis; then
    redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$state" --appendonly yes --appendfsync always \
      --save "" --daemonize yes --pidfile "$state/redis.pid" --logfile "$state/redis.log"
    wait_for "redis-server on port $redis_port" redis-cli -p "$redis_port" ping
  fi
  if ! running temporal; then
    attrs=()
    for a in PinflowInstance PinflowOperation PinflowSourceHost PinflowDestHost PinflowPhase; do
      attrs+=(--search-attribute "$a=Keyword")
    done
    nohup "$temporal" server start-dev --ip 127.0.0.1 --port "$temporal_port" --ui-port "$ui_port" \
      --db-filename "$state/temporal.db" --log-level error "${attrs[@]}" \
      --dynamic-config-value history.transferProcessorMaxPollRPS=1000 \
      >"$state/temporal.log" 2>&1 &
    echo $! >"$state/temporal.pid"
    wait_for "the Temporal dev server on port $temporal_port" \
      "$temporal" operator cluster health --address "127.0.0.1:$temporal_port"
  fi
  if ! running worker; then
    nohup "$root/bin/pinflow-worker" >"$state/worker.log" 2>&1 &
    echo $! >"$state/worker.pid"
    sleep 1
    running worker || { echo "devstack: the worker exited; see $state/worker.log" >&2; tail -5 "$state/worker.log" >&2; exit 1; }
  fi
  status
}

down() {
  for p in worker temporal; do
    if running "$p"; then
      kill "$(cat "$state/$p.pid")" 2>/dev/null || true
      for _ in $(seq 1 50); do running "$p" || break; sleep 0.2; done
      running "$p" && kill -9 "$(cat "$state/$p.pid")" 2>/dev/null || true
    fi
    rm -f "$state/$p.pid"
  done
  if running redis; then
    redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || kill "$(cat "$state/redis.pid")" || true
  fi
  rm -f "$state/redis.pid"
  echo "devstack: stopped (state kept in $state)"
}

status() {
  for p in redis temporal worker; do
    if running "$p"; then echo "  $p: running (pid $(cat "$state/$p.pid"))"; else echo "  $p: stopped"; fi
  done
  echo "  Redis $PINFLOW_REDIS_URL, Temporal $PINFLOW_TEMPORAL_ADDRESS, Web UI http://127.0.0.1:$ui_port, logs in $state"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: deploy/devstack.sh up|down|status" >&2; exit 2 ;;
esac
