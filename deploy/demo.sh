#!/usr/bin/env bash
# pinflow's main job on a fresh dev stack: four simulated NUMA hosts, pinned
# guests booted on them, live migrations running concurrently, a
# shelve-offload and an unshelve, a resize reverted and one confirmed, a
# cold migration, a crashed host evacuated and brought back; host CPU maps
# before and after, and the ledger's invariants checked at the end. The stack keeps running so the
# workflows can be browsed in the Temporal Web UI; `make down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PINFLOW_STATE_DIR=${PINFLOW_STATE_DIR:-$PWD/.state}
pinflow=bin/pinflow

step() { printf '\n== %s\n' "$*"; }

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
    --spec hw:cpu_policy=dedicated "${args[@]}" --wait --json | sed -n 's/.*"uuid": "\(.*\)".*/\1/p' >"$PINFLOW_STATE_DIR/$name.uuid"
}
boot db-1 host-1 4 hw:cpu_thread_policy=require &
boot db-2 host-1 4 hw:numa_nodes=2 &
boot web-1 host-2 2 hw:emulator_threads_policy=isolate &
boot web-2 host-2 2 hw:mem_page_size=large &
boot cache-1 host-3 6 &
boot rt-1 host-3 4 hw:cpu_realtime=yes hw:cpu_realtime_mask=^0 &
wait
uuid() { cat "$PINFLOW_STATE_DIR/$1.uuid"; }
$pinflow host list

step "live-migrating four guests at once (each migration takes 3 s in the simulator)"
$pinflow sim latency --op migrate --seconds 3 >/dev/null
$pinflow migrate "$(uuid db-1)" --dest host-4 --wait &
$pinflow migrate "$(uuid web-1)" --dest host-1 --wait &
$pinflow migrate "$(uuid cache-1)" --wait &
$pinflow migrate "$(uuid rt-1)" --dest host-2 --wait &
wait

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
$pinflow show "$(uuid db-2)"

step "host-2 crashes: fenced by the operator, its guests evacuated, then it comes back"
$pinflow sim power --host host-2 --off >/dev/null
$pinflow host down host-2 --fence --reason "demo: power supply failed"
$pinflow host evacuate host-2 --wait
$pinflow host list
$pinflow sim power --host host-2 --on >/dev/null
$pinflow host up host-2 --wait

step "the hosts after the moves"
$pinflow host list

step "checking the ledger"
$pinflow check

ui_port=${PINFLOW_UI_PORT:-8233}
step "done"
echo "Every operation above is a workflow in the Temporal Web UI:"
echo "  http://127.0.0.1:$ui_port/namespaces/default/workflows"
echo "  (filter: PinflowOperation=\"live-migration\", or PinflowInstance=\"$(uuid db-1)\")"
echo "The stack keeps running; stop it with: make down"
