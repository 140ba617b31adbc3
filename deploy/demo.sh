#!/usr/bin/env bash
# pinflow's main job on a fresh dev stack: four simulated NUMA hosts, pinned
# guests booted on them and guests that float on the shared CPUs beside
# them, live migrations running concurrently, a shelve-offload and an
# unshelve, a resize reverted and one confirmed, a cold migration, a
# crashed host evacuated and brought back; two hosts with an SR-IOV NIC and
# a guest with an SR-IOV port live-migrated between them; an anti-affinity
# server group with a disruption budget, a move onto a member's host
# refused, and a host drained while another member moves, the group's rule
# held throughout; a boot that fits nowhere refused and explained; a
# guest's operations; host CPU maps before and after, and the ledger's
# invariants checked against every host's domains at the end. It exits
# non-zero when any step fails, or when a step meant to be refused is not.
# The stack keeps running so the workflows can be browsed in the Temporal
# Web UI; `make down` stops it. PINFLOW_REDIS_PORT, PINFLOW_TEMPORAL_PORT
# and PINFLOW_UI_PORT move the stack off the default ports
# (deploy/devstack.sh).
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
# expect WANT command...: the command must succeed and say WANT.
expect() {
  local want=$1 out; shift
  out=$("$@")
  printf '%s\n' "$out"
  grep -qF -- "$want" <<<"$out" || { echo "demo: '$*' did not say '$want'" >&2; return 1; }
}
# refused WANT command...: the command must fail, saying WANT.
refused() {
  local want=$1 out; shift
  if out=$("$@" 2>&1); then
    printf '%s\n' "$out"
    echo "demo: '$*' succeeded; it should have been refused" >&2
    return 1
  fi
  printf '%s\n' "$out"
  grep -qF -- "$want" <<<"$out" || { echo "demo: '$*' was refused, but not for '$want'" >&2; return 1; }
}
# await WHAT command...: polls the command until it succeeds, for a minute at most.
await() {
  local what=$1; shift
  for _ in $(seq 1 300); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "demo: still waiting for $what after a minute" >&2
  return 1
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
start() { # name boot-flags...: boots the guest and keeps its uuid
  local name=$1; shift
  # sed reads the whole answer, so boot never writes to a closed pipe.
  $pinflow boot --name "$name" "$@" --wait --json |
    sed -n 's/^  "uuid": "\(.*\)",$/\1/p' >"$PINFLOW_STATE_DIR/$name.uuid"
  [ -s "$PINFLOW_STATE_DIR/$name.uuid" ] || { echo "demo: boot of $name gave no uuid" >&2; return 1; }
}
boot() { # name host vcpus specs...
  local name=$1 host=$2 vcpus=$3; shift 3
  local args=()
  for s in "$@"; do args+=(--spec "$s"); done
  start "$name" --host "$host" --vcpus "$vcpus" --memory-mb 2048 "${args[@]}"
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

resized() { $pinflow show "$(uuid "$1")" | grep -F 'vm_state resized' >/dev/null; }
step "resizing cache-1 from 6 to 4 vCPUs: in VERIFY_RESIZE its old pins stay held (^), then a revert puts it back on them"
$pinflow resize "$(uuid cache-1)" --vcpus 4 --confirm-window never >/dev/null
await "cache-1 to be resized" resized cache-1
$pinflow show "$(uuid cache-1)"
$pinflow host list
$pinflow resize revert "$(uuid cache-1)" --wait
$pinflow show "$(uuid cache-1)"

step "resizing it again and confirming: the hold is freed at once"
$pinflow resize "$(uuid cache-1)" --vcpus 4 --confirm-window never >/dev/null
await "cache-1 to be resized" resized cache-1
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

step "two hosts with an SR-IOV NIC on cell 0; edge-1's port takes a VF of nic-1"
nic_host() { # name bus: a host like the others, with a PF and two VFs on physnet1 at 0000:BUS
  local name=$1 bus=$2
  cat >"$PINFLOW_STATE_DIR/$name.json" <<EOF
{
  "cpu_shared_set": "0-1,8-9",
  "cpu_dedicated_set": "2-7,10-15",
  "cells": [
    {"id": 0, "cpus": [0, 1, 2, 3, 4, 5, 6, 7], "siblings": [[0, 1], [2, 3], [4, 5], [6, 7]], "memory_mb": 16384},
    {"id": 1, "cpus": [8, 9, 10, 11, 12, 13, 14, 15], "siblings": [[8, 9], [10, 11], [12, 13], [14, 15]], "memory_mb": 16384}
  ],
  "pci_devices": [
    {"address": "0000:$bus:00.0", "vendor_id": "8086", "product_id": "1572", "dev_type": "type-PF",
     "numa_node": 0, "tags": {"physical_network": "physnet1"}},
    {"address": "0000:$bus:10.0", "vendor_id": "8086", "product_id": "154c", "dev_type": "type-VF",
     "parent_addr": "0000:$bus:00.0", "numa_node": 0, "tags": {"physical_network": "physnet1"}},
    {"address": "0000:$bus:10.1", "vendor_id": "8086", "product_id": "154c", "dev_type": "type-VF",
     "parent_addr": "0000:$bus:00.0", "numa_node": 0, "tags": {"physical_network": "physnet1"}}
  ]
}
EOF
  $pinflow host add "$name" --topology "$PINFLOW_STATE_DIR/$name.json"
}
nic_host nic-1 81
nic_host nic-2 82
start edge-1 --host nic-1 --vcpus 2 --memory-mb 2048 --spec hw:cpu_policy=dedicated \
  --port name=data,physnet=physnet1,vnic=direct
$pinflow show "$(uuid edge-1)"

step "live-migrating edge-1 to nic-2: its VF unplugged, the guest moved, a VF of nic-2 plugged in"
$pinflow migrate "$(uuid edge-1)" --dest nic-2 --wait
expect "0000:82:10.0 (port data)" $pinflow show "$(uuid edge-1)"

step "server group quorum: one member per host, at most one moving at once"
$pinflow group create quorum --policy anti-affinity --max-unavailable 1
member() { start "$1" --group quorum --host "$2" --vcpus 2 --memory-mb 2048 --spec hw:cpu_policy=dedicated; }
member quorum-1 host-1 &
pids+=($!)
member quorum-2 host-3 &
pids+=($!)
member quorum-3 host-4 &
pids+=($!)
waitall
$pinflow group show quorum
refused "allows 1 of its members per host" $pinflow migrate "$(uuid quorum-1)" --dest host-4 --wait

step "draining host-1 while quorum-3 moves: quorum-1 waits its turn, then goes where no member is"
# quorum-3's migration is held before its switchover, so the budget is seen at work.
gate=(--at switchover --guest "$(uuid quorum-3)")
$pinflow sim gate "${gate[@]}" --hold >/dev/null
$pinflow migrate "$(uuid quorum-3)" --dest nic-1 --wait &
pids+=($!)
$pinflow sim gate "${gate[@]}" --wait-arrived 1 >/dev/null
$pinflow host plan-drain host-1
$pinflow host drain host-1 --reason "demo: firmware update" --wait &
pids+=($!)
drain_waits() { $pinflow host drain status host-1 | grep -F "waiting for the disruption budget of group quorum" >/dev/null; }
await "host-1's drain to wait for quorum's budget" drain_waits
$pinflow host drain status host-1
$pinflow group show quorum
$pinflow sim gate "${gate[@]}" --release >/dev/null
waitall
expect "rule: holds" $pinflow group show quorum

step "8 pinned vCPUs fit no NUMA cell of 6 pCPUs: the boot is refused, and explain says why"
refused "no fit" $pinflow boot --name huge-1 --vcpus 8 --memory-mb 2048 --spec hw:cpu_policy=dedicated --wait
expect "no host takes it now" $pinflow explain --vcpus 8 --memory-mb 2048 --spec hw:cpu_policy=dedicated
# The refused guest's record stays in error until it is deleted.
$pinflow delete "$($pinflow list | awk '$2 == "huge-1" {print $1}')" --wait

step "the operations of cache-1, newest first"
expect "resize" $pinflow ops "$(uuid cache-1)"

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
