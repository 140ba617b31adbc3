# pinflow: see README.md. `make test` and `make demo` set up what they need.
GO      ?= go
SHELL   := /bin/bash
# A pipe fails when a command in it does (go test into testtimes).
.SHELLFLAGS := -o pipefail -c
BIN     := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

STATICCHECK_VERSION ?= v0.8.2
WORKFLOWCHECK_VERSION ?= v0.6.0

.PHONY: all build deps test test-times test-stress test-short lint fuzz bench bench-e2e up down demo clean

all: build

# The release a build reports ('pinflow --version'): the nearest tag and
# how far past it, or the commit when no tag is reachable; empty without
# git, and the binary falls back to the module's version.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION)

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/pinflow ./starter
	$(GO) build -o $(BIN)/pinflow-worker ./worker

deps:
	./deploy/deps.sh

# Nova's scenarios and the randomized audit, run again on the cluster
# deploy/cluster.sh starts (the TestCluster* failure tests always run on it).
CLUSTER_SUITE := ^(TestNovaBug1845146|TestMigrationFailureLeavesTheSource|TestShelveUnshelveSpawnFailure|TestUnshelveAfterShelve|TestWorkerKilledDuringMigration|TestBadInput|TestReconcileRandomized)$$

# The end-to-end tests mostly wait on servers, workflows and guests, so
# six run at once (they call t.Parallel; the real libvirt ones take one
# of the six, one after the other), and the cluster suite runs beside the
# rest: its servers are its own. Each run ends with a table of the
# packages' wall times and the slowest tests; `make test-times` prints it
# again.
TESTFLAGS ?= -race -count=1 -parallel 6
test: deps
	$(GO) vet ./...
	$(GO) build -o $(BIN)/testtimes ./internal/testtimes
	@PINFLOW_E2E_TARGET=cluster $(GO) test $(TESTFLAGS) -timeout 30m -json ./internal/e2e -run '$(CLUSTER_SUITE)' \
		| $(BIN)/testtimes -save $(BIN)/test-events-cluster.json > $(BIN)/test-cluster.log 2>&1 & cluster=$$!; \
	echo "the cluster suite runs under PINFLOW_E2E_TARGET=cluster beside the main run"; \
	$(GO) test $(TESTFLAGS) -timeout 45m -json ./... | $(BIN)/testtimes -save $(BIN)/test-events.json; main=$$?; \
	wait $$cluster; cluster=$$?; echo "cluster suite:"; cat $(BIN)/test-cluster.log; \
	[ $$main = 0 ] && [ $$cluster = 0 ]

# The whole suite while stress-ng keeps every core busy: no test may
# depend on how fast the machine is. STRESS_RUNS=5 runs it five times and
# stops at the first failure.
STRESS_RUNS ?= 1
test-stress: deps
	@for i in $$(seq $(STRESS_RUNS)); do \
		stress-ng --cpu "$$(nproc)" --timeout 0 --quiet & hog=$$!; start=$$(date +%s); \
		$(MAKE) --no-print-directory test; rc=$$?; \
		kill $$hog; wait $$hog 2>/dev/null; \
		echo "test-stress: run $$i of $(STRESS_RUNS) under $$(nproc) busy CPUs: exit $$rc after $$(( $$(date +%s) - start )) s"; \
		[ $$rc = 0 ] || exit $$rc; \
	done

test-times:
	$(GO) run ./internal/testtimes -from $(BIN)/test-events.json
	$(GO) run ./internal/testtimes -from $(BIN)/test-events-cluster.json

test-short:
	$(GO) test -short -count=1 ./...

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@[ -x $(BIN)/staticcheck ] || GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(BIN)/staticcheck ./...
	@[ -x $(BIN)/workflowcheck ] || GOBIN=$(BIN) $(GO) install go.temporal.io/sdk/contrib/tools/workflowcheck@$(WORKFLOWCHECK_VERSION)
	$(BIN)/workflowcheck ./workflows/...

# Short fuzzing runs of every fuzz target; FUZZTIME=5m for a longer one.
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./numa -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME)
	$(GO) test ./numa -run '^$$' -fuzz '^FuzzFit$$' -fuzztime $(FUZZTIME)
	$(GO) test ./numa -run '^$$' -fuzz '^FuzzFitDevices$$' -fuzztime $(FUZZTIME)
	$(GO) test ./xmlpatch -run '^$$' -fuzz '^FuzzPatch$$' -fuzztime $(FUZZTIME)

# Benchmarks print their figures next to the reference they are compared
# with (Nova's own median per fit, measured on this kind of machine).
bench:
	$(GO) test ./numa -run '^$$' -bench . -benchmem -count 1

# Completed live migrations per second with 32 and 128 in flight, against
# a bare workflow with as many no-op activities: on a dev server with one
# worker, then on the cluster (deploy/cluster.sh) with three.
bench-e2e: deps
	$(GO) test ./internal/e2e -run '^$$' -bench LiveMigration -benchtime 640x -count 1
	PINFLOW_E2E_TARGET=cluster $(GO) test ./internal/e2e -run '^$$' -bench LiveMigration -benchtime 640x -count 1

# A dev stack in the background: Redis, the Temporal dev server with its
# Web UI on 8233, and a worker (see deploy/devstack.sh for the ports).
up: deps build
	./deploy/devstack.sh up

down:
	./deploy/devstack.sh down

# The distributed deployment on this machine: PostgreSQL, two Temporal
# nodes, a Redis Cluster of six and three workers (see deploy/cluster.sh).
.PHONY: cluster-up cluster-down
cluster-up: deps build
	./deploy/cluster.sh up

cluster-down:
	./deploy/cluster.sh down

# pinflow's main job on a fresh stack: hosts, pinned guests, concurrent
# live migrations, a shelve-offload and an unshelve, invariants checked.
demo: deps build
	./deploy/demo.sh

# A long randomized run of every operation with cancels, terminations,
# hypervisor faults and latencies, worker kill -9 every half minute, Redis
# restarts and an audit every second; prints what ran and fails on any
# double pin or final mismatch. make test runs a short one.
SOAK_OPS ?= 10000
SOAK_MINUTES ?= 150
.PHONY: soak
soak: deps
	PINFLOW_SOAK_OPS=$(SOAK_OPS) PINFLOW_SOAK_HOSTS=8 PINFLOW_SOAK_GUESTS=40 PINFLOW_SOAK_MINUTES=$(SOAK_MINUTES) \
		PINFLOW_SOAK_KILL_SECONDS=30 PINFLOW_SOAK_REDIS_SECONDS=60 \
		$(GO) test ./internal/e2e -run '^TestSoak$$' -count 1 -v -timeout 4h

clean:
	rm -rf $(BIN)/pinflow $(BIN)/pinflow-worker

# 500 boots started at once onto four hosts, against as many bare
# workflows of four no-op activities: ten runs on a dev server, then
# three on the cluster, each printing the slowest wait for a first
# workflow task.
bench-boot: deps
	$(GO) test ./internal/e2e -run '^$$' -bench BootBurst -benchtime 1x -count 10 -timeout 60m
	PINFLOW_E2E_TARGET=cluster $(GO) test ./internal/e2e -run '^$$' -bench BootBurst -benchtime 1x -count 3 -timeout 60m
.PHONY: bench-boot

# 1,000 simulated hosts holding 20,000 guests under a steady mix of boots,
# deletes, live migrations, resizes and a drain from 16 clients, through
# the real worker: 3 minutes with the audit on its schedule and 3 with it
# off, operations per second and each kind's p50 and p99.
bench-fleet: deps
	$(GO) test ./internal/e2e -run '^$$' -bench '^BenchmarkFleet$$' -benchtime 1x -count 1 -timeout 60m
.PHONY: bench-fleet

# Every command that walks the fleet (host list, list, check, a drain plan,
# the audit) on 100,000 simulated hosts with a guest each: wall time, the
# CLI's peak memory and what it printed. BASELINE=path/to/pinflow runs a
# build of another commit beside it on the same fleet.
bench-walk: deps
	PINFLOW_BENCH_WALK_BASELINE=$(BASELINE) $(GO) test ./internal/e2e -run '^$$' -bench '^BenchmarkFleetWalk$$' -benchtime 1x -count 1 -timeout 60m
.PHONY: bench-walk

# Defragmentation: a fleet of 1,000 fragmented hosts before and after its
# plans, for a flavor of 8 vCPUs that needs 4 whole cores, and the plans'
# re-pins against a brute-force search on small hosts.
bench-defrag:
	$(GO) test ./defrag -run '^$$' -bench 'Defrag' -benchtime 1x -count 1 -timeout 30m
.PHONY: bench-defrag

bench-ledger: deps
	$(GO) test ./ledger -run '^$$' -bench ClaimRelease -benchtime 3s -count 1

# One ledger audit of 1,000 simulated hosts of 20 guests each, with 500
# workflows open on a real dev server, next to its floor: the same Redis
# reads with no decisions.
.PHONY: bench-reconcile
bench-reconcile: deps
	$(GO) test ./audit -run '^$$' -bench ReconcileAudit -benchtime 1x -count 1 -timeout 30m

# The Reconcile workflow's audit of 20,000 simulated hosts
# (PINFLOW_BENCH_AUDIT_HOSTS) in pages, on a dev server with one worker,
# then on the cluster with three: wall time and history events per run,
# next to the floor of the same reads.
.PHONY: bench-audit
bench-audit: deps
	$(GO) test ./internal/e2e -run '^$$' -bench AuditFleet -benchtime 1x -count 1 -timeout 60m
	PINFLOW_E2E_TARGET=cluster $(GO) test ./internal/e2e -run '^$$' -bench AuditFleet -benchtime 1x -count 1 -timeout 60m

# ChooseHost p50 and p99 among 1,000, 10,000 and 100,000 hosts of varied
# fill on one redis-server: the placement index next to the exhaustive
# scan, on the same fleet and requests (a handful of exhaustive calls at
# 100,000 hosts); then a drain of a 40-guest host onto 200 hosts through a
# dev server at parallelism 1, 5 and 20.
.PHONY: bench-place
bench-place: deps
	$(GO) test ./placement -run '^$$' -bench ChooseHost -benchtime 1x -count 1 -timeout 60m
	$(GO) test ./internal/e2e -run '^$$' -bench Drain -benchtime 1x -count 1 -timeout 30m

# The Web UI check: a migration through the CLI on a dev stack, then the
# Temporal Web UI in headless Chromium (installed here when missing and
# root). Screenshots and DOM dumps go to UI_CHECK_DIR.
UI_CHECK_DIR ?= $(CURDIR)/.ui-check
.PHONY: ui-check
ui-check: deps
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" -ne 0 ] || { \
	  echo "ui-check: installing chromium"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	PINFLOW_UI_CHECK_DIR=$(UI_CHECK_DIR) $(GO) test ./internal/e2e -tags uicheck -run '^TestWebUI$$' -count 1 -v -timeout 10m
