#!/usr/bin/env bash
# pinflow's main job on a fresh dev stack: four simulated NUMA hosts, pinned
# guests booted on them and guests that float on the shared CPUs beside
# them, live migrations running concurrently, a shelve-offload and an
# unshelve, a resize reverted and one confirmed, a cold migration, a
# crashed host evacuated and brought back; host CPU maps before and after,
# and the ledger's invariants checked against every host's domains at the
# end. It exits non-zero when any step fails. The stack keeps running so
# the workflows can be browsed in the Temporal Web UI; `make down` stops
# it. PINFLOW_REDIS_PORT, PINFLOW_TEMPORAL_PORT and PINFLOW_UI_PORT move
# the stack off the default ports (deploy/devstack.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export PINFLOW_STATE_DIR=${PINFLOW_STATE_DIR:-$PWD/.state}
# The ports deploy/devstack.sh serves on, for the CLI too.
export PINFLOW_REDIS_URL=${PINFLOW_REDIS_URL:-redis://127.0.0.1:${PINFLOW_REDIS_PORT:-6379}/0}
export PINFLOW_TEMPORAL_ADDRESS=${PINFLOW_TEMPORAL_ADDRESS:-127.0.0.1:${PINFLOW_TEMPORAL_PORT:-7233}}
pinflow=bin/pinflow

step() { printf '\n== %s\n' "$*"; }
# Steps run in the background are waited for one by one, so the demo
# fails when any of them does.
pids=()
waitall() {
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  pids=()
  return $rc
}

step "starting a fresh dev stack in $PINFLOW_STATE_DIR"
deploy/devstack.sh down >/dev/null 2>&1 || true
rm -rf "$PINFLOW_STATE_DIR"
deploy/devstack.sh up

step "registering four simulated hosts: 2 NUMA cells x 4 cores x 2 threads, cores 0 shared"
for h in host-1 host-2 host-3 host-4; do
  $pinflow host add "$h" --cells 2 --cores 4 --threads 2 --shared 0-1,8-9 --dedicated 2-7,10-15 --memory-mb 16384 --hugepages 2M:2048
done

step "booting pinned guests (in parallel)"
boot() { # name host vcpus specs...
  local name=$1 host=$2 vcpus=$3; shift 3
  local args=()
  for s in "$@"; do args+=(--spec "$s"); done
  $pinflow boot --name "$name" --host "$host" --vcpus "$vcpus" --memory-mb 2048 \
    "${args[@]}" --wait --json | grep -m1 '"uuid"' | sed 's/.*"uuid": "\(.*\)".*/\1/' >"$PINFLOW_STATE_DIR/$name.uuid"
}
pinned() { local name=$1 host=$2 vcpus=$3; shift 3; boot "$name" "$host" "$vcpus" hw:cpu_policy=dedicated "$@"; }
pinned db-1 host-1 4 hw:cpu_thread_policy=require &
pids+=($!)
pinned db-2 host-1 4 hw:numa_nodes=2 &
pids+=($!)
pinned web-1 host-2 2 hw:emulator_threads_policy=isolate &
pids+=($!)
pinned web-2 host-2 2 hw:mem_page_size=large &
pids+=($!)
pinned cache-1 host-3 6 &
pids+=($!)
pinned rt-1 host-3 4 hw:cpu_realtime=yes hw:cpu_realtime_mask=^0 &
pids+=($!)
waitall
uuid() { cat "$PINFLOW_STATE_DIR/$1.uuid"; }
$pinflow host list

step "live-migrating four guests at once (each migration takes 3 s in the simulator)"
$pinflow sim latency --op migrate --seconds 3 >/dev/null
$pinflow migrate "$(uuid db-1)" --dest host-4 --wait &
pids+=($!)
$pinflow migrate "$(uuid web-1)" --dest host-1 --wait &
pids+=($!)
$pinflow migrate "$(uuid cache-1)" --wait &
pids+=($!)
$pinflow migrate "$(uuid rt-1)" --dest host-2 --wait &
pids+=($!)
waitall

step "booting guests that float: they run on the shared CPUs alone, never on a pinned guest's"
boot batch-1 host-1 2
boot mixed-1 host-4 2 hw:cpu_policy=mixed hw:cpu_dedicated_mask=^0
$pinflow show "$(uuid batch-1)"
$pinflow show "$(uuid mixed-1)"

step "shelving web-2 (its pins are freed at once), then unshelving it"
$pinflow shelve "$(uuid web-2)" --offload --wait
$pinflow show "$(uuid web-2)"
$pinflow unshelve "$(uuid web-2)" --wait
$pinflow show "$(uuid web-2)"

step "resizing cache-1 from 6 to 4 vCPUs: in VERIFY_RESIZE its old pins stay held (^), then a revert puts it back on them"
$pinflow resize "$(uuid cache-1)" --vcpus 4 --confirm-window 0 >/dev/null
until $pinflow show "$(uuid cache-1)" | grep -q 'vm_state resized'; do sleep 0.5; done
$pinflow show "$(uuid cache-1)"
$pinflow host list
$pinflow resize revert "$(uuid cache-1)" --wait
$pinflow show "$(uuid cache-1)"

step "resizing it again and confirming: the hold is freed at once"
$pinflow resize "$(uuid cache-1)" --vcpus 4 --confirm-window 0 >/dev/null
until $pinflow show "$(uuid cache-1)" | grep -q 'vm_state resized'; do sleep 0.5; done
$pinflow resize confirm "$(uuid cache-1)" --wait
$pinflow show "$(uuid cache-1)"

step "cold-migrating db-2 (powered off, moved, started; confirmed by a 2 s window)"
$pinflow migrate "$(uuid db-2)" --cold --confirm-window 2s --wait
$pinflow follow "$(uuid db-2)"
$pinflow show "$(uuid db-2)"

step "live-migrating batch-1: it floats over its destination's shared CPUs"
$pinflow migrate "$(uuid batch-1)" --dest host-3 --wait
$pinflow show "$(uuid batch-1)"

step "host-2 crashes: fenced by the operator, its guests evacuated, then it comes back"
$pinflow sim power --host host-2 --off >/dev/null
$pinflow host down host-2 --fence --reason "demo: power supply failed"
$pinflow host evacuate host-2 --wait
$pinflow host list
$pinflow sim power --host host-2 --on >/dev/null
$pinflow host up host-2 --wait

step "the hosts after the moves"
$pinflow host list

step "checking the ledger against every host's domains"
$pinflow check

ui_port=${PINFLOW_UI_PORT:-8233}
step "done"
echo "Every operation above is a workflow in the Temporal Web UI:"
echo "  http://127.0.0.1:$ui_port/namespaces/default/workflows"
echo "  (filter: PinflowOperation=\"live-migration\", or PinflowInstance=\"$(uuid db-1)\")"
echo "The stack keeps running; stop it with: make down"
