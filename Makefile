# paseo-policy. `make demo` compiles and explains the reference facts;
# `make test` runs every test (some need root: CI runs as root).
GO ?= go
BIN := bin

.PHONY: all build runsc demo test vet race unit fuzz bench golden clean

all: build

build:
	$(GO) build -o $(BIN)/paseo-policy ./cmd/paseo-policy

# The pinned runsc (tools/runsc/go.mod), built static from the Go module
# proxy; its digest goes to bin/runsc.sha256 for the launcher's preflight.
runsc:
	tools/runsc/build.sh $(CURDIR)/$(BIN)/runsc

demo: build
	./scripts/demo.sh

test: runsc vet fuzz race unit

vet:
	$(GO) vet ./...

# The compiler promises that concurrent compiles share nothing mutable.
race:
	$(GO) test -race -count=1 -run 'Concurrent|Golden' ./compiler ./schema

unit:
	$(GO) test -count=1 ./...

# Each fuzz target runs briefly; a finding fails the build and leaves its
# input under testdata/fuzz for the regression run in `unit`.
FUZZTIME ?= 10s
fuzz:
	$(GO) test -run=^$$ -fuzz=^FuzzLoadFacts$$ -fuzztime=$(FUZZTIME) ./schema
	$(GO) test -run=^$$ -fuzz=^FuzzCheck$$ -fuzztime=$(FUZZTIME) ./internal/pathform
	$(GO) test -run=^$$ -fuzz=^FuzzResolve$$ -fuzztime=$(FUZZTIME) ./compiler/pathsafe

bench: build
	./scripts/bench.sh

# Rewrite golden files after an intended change; review the diff.
golden:
	PASEO_UPDATE=1 $(GO) test -count=1 ./compiler/ ./cli/

clean:
	rm -rf $(BIN) .demo
