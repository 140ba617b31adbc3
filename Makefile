# pinflow: see README.md. `make test` and `make demo` set up what they need.
GO      ?= go
BIN     := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

STATICCHECK_VERSION ?= v0.8.2

.PHONY: all build deps test test-short lint fuzz bench demo clean

all: build

build:
	$(GO) build -o $(BIN)/pinflow ./starter

deps:
	./deploy/deps.sh

test: deps
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

test-short:
	$(GO) test -short -count=1 ./...

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@[ -x $(BIN)/staticcheck ] || GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(BIN)/staticcheck ./...

# Short fuzzing runs of every fuzz target; FUZZTIME=5m for a longer one.
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./numa -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME)
	$(GO) test ./numa -run '^$$' -fuzz '^FuzzFit$$' -fuzztime $(FUZZTIME)
	$(GO) test ./xmlpatch -run '^$$' -fuzz '^FuzzPatch$$' -fuzztime $(FUZZTIME)

# Benchmarks print their figures next to the reference they are compared
# with (Nova's own median per fit, measured on this kind of machine).
bench:
	$(GO) test ./numa -run '^$$' -bench . -benchmem -count 1

demo: build
	@echo "pinflow numa fit: the offline NUMA fit on shipped reference hosts"
	@echo "(the workflow demo is not there yet; see README.md)"
	$(BIN)/pinflow numa fit numa/testdata/nova/anchors.json

clean:
	rm -rf $(BIN)/pinflow
