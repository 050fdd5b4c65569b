# paseo-policy. `make demo` runs one sandboxed Pi turn (as root; without
# root it compiles and explains the reference facts); `make test` installs
# what it needs (as root) and runs every test (some need root: CI runs as
# root).
GO ?= go
BIN := bin

# A test that cannot run without root skips through internal/testkit/skip
# for an unprivileged `go test ./...`; under make every such skip fails
# instead, so `make test` (root, as CI runs it) has run every test.
export PASEO_NO_SKIP := 1

.PHONY: all build cross runsc demo test test-pi-contract deps deps-demo script-tests vet race unit unit-unprivileged fuzz acceptance e2e-pi e2e-continuity e2e-ts e2e-paseo bench bench-launch bench-pi bench-tools golden clean image bench-bridge shim containerd kubernetes

all: build

build:
	$(GO) build -o $(BIN)/paseo-policy ./cmd/paseo-policy

# The pinned runsc (tools/runsc/go.mod), built static from the Go module
# proxy; its digest goes to bin/runsc.sha256 for the launcher's preflight.
runsc:
	tools/runsc/build.sh $(CURDIR)/$(BIN)/runsc

# gVisor's containerd shim from the same pinned module as runsc
# (tools/runsc/go.mod), and the containerd release that shim's library
# comes from (tools/containerd/go.mod), for the node runtime test.
shim:
	tools/runsc/build-shim.sh $(CURDIR)/$(BIN)/containerd-shim-runsc-v1
containerd:
	tools/containerd/build.sh $(CURDIR)/$(BIN)

# linux/arm64, the seed's other architecture: every command and the pinned
# runsc cross-build, every package vets (tests included) for arm64, and the
# packages that need neither root, runsc nor openat2 run their tests on
# arm64 under qemu-user (whose 7.2 has no openat2, so path resolution fails
# closed there; routeproxy's differential test runs the host's node beside
# it). docs/spec.md says what stays unproven.
CROSS_TEST := ./policy/schema ./policy/grant ./policy/bundle ./internal/pathform ./runtime/bridge ./internal/testkit/piproto ./runtime/launcher/routeproxy
# The subscription-login routes open the deployment's auth.json dir with
# openat2, which qemu-user 7.2 lacks (they fail closed there, as every
# openat2 path does): those tests run natively in unit, not under qemu.
CROSS_SKIP := ^(TestCodex|TestLoginRoute)
QEMU_ARM64 ?= qemu-aarch64-static
cross:
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -o $(BIN)/linux-arm64/ ./cmd/... ./test/cmd/...
	GOOS=linux GOARCH=arm64 $(GO) vet ./...
	GOARCH=arm64 tools/runsc/build.sh $(CURDIR)/$(BIN)/linux-arm64/runsc
	@command -v $(QEMU_ARM64) >/dev/null || { echo "cross: $(QEMU_ARM64) is missing (apt-get install qemu-user-static)"; exit 1; }
	$(QEMU_ARM64) $(BIN)/linux-arm64/runsc --version
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) test -exec $(QEMU_ARM64) -count=1 -skip '$(CROSS_SKIP)' $(CROSS_TEST)

# As root, the real Pi in gVisor through the supervisor on one scripted
# turn (test/cmd/paseo-demo, docs/demo.md), which needs the pinned runsc and the
# image (both no-ops when up to date); without root, compile and explain
# only, and say what the rest needs.
DEMO_NEEDS := $(if $(filter 0,$(shell id -u)),runsc image)
demo: deps-demo build $(DEMO_NEEDS)
	$(GO) build -o $(BIN)/paseo-demo ./test/cmd/paseo-demo
	PASEO_POLICY=$(BIN)/paseo-policy PASEO_DEMO=$(BIN)/paseo-demo RUNSC=$(BIN)/runsc ./scripts/demo.sh

test: deps script-tests runsc image vet cross fuzz unit unit-unprivileged acceptance test-pi-contract e2e-pi e2e-continuity e2e-ts e2e-paseo kubernetes

# The Debian packages the tests and the runsc and image builds exec (file, a
# static busybox, git, debootstrap, erofs-utils, npm, qemu-user-static...):
# as root, the missing ones are installed through this machine's apt
# configuration; without root, scripts/deps.sh prints the apt-get line and
# fails. deps-demo only warns without root (the demo's compile-and-explain
# part needs none of them).
deps:
	scripts/deps.sh
deps-demo:
	scripts/deps.sh --warn

# The build scripts' own tests (a few seconds): scripts/deps.sh's decisions
# (root: it runs the script as nobody too) and the progress lines the runsc
# and image builds print, without running either build.
script-tests: deps
	scripts/deps_test.sh
	scripts/progress_test.sh

vet:
	$(GO) vet ./...

# Every test runs under the race detector: the launcher, supervisor,
# holders, bridge, execution and route proxy have goroutines, and the
# compiler promises that concurrent compiles share nothing mutable.
RACE := -race

# Every package but the acceptance proof, the real-Pi tests, the Pi contract and the
# supervisor's continuity tests, which have their own targets (also -race).
unit:
	$(GO) test $(RACE) -count=1 $$($(GO) list ./... | grep -v -e '/acceptance$$' -e '/e2e$$' -e '/supervisor$$' -e '/picontract$$')

# Every package's tests once more as nobody, as a developer without root
# runs `go test ./...`: a root-only test must skip there (through
# internal/testkit/skip), never fail. Root (it drops to nobody per binary).
unit-unprivileged:
	scripts/unit-unprivileged.sh

# Every package with goroutines under the race detector: unit, then the
# supervisor (e2e-continuity and acceptance run -race as well).
race: unit
	$(GO) test $(RACE) -count=1 ./runtime/supervisor

# e2e-continuity runs these real-Pi tests; e2e-pi runs every other TestPi*,
# so a new one is never left out.
E2E_CONTINUITY := ContinuityThroughSupervisor|OfficialContainer

# The real Pi (the pinned image) in gVisor: turns, tool calls, denied
# escapes, session resume, the probes, the MCP route and its token across a
# daemon restart, planted code and settings, OAuth files, Git work and
# control files (a linked and a main worktree), a deployment's own uid.
# Root.
# The Pi contract suite (test/picontract): what paseo-policy relies on from
# the image's Pi (RPC frames and commands, settings keys, environment, the
# files it writes, extension loading, the model catalogue the compiler
# embeds), against its record in test/picontract/testdata/pi-<version>.json.
# A Pi upgrade: bump the pin, `make image test-pi-contract`, read the diff
# (docs/image.md, "Upgrading Pi"). Runs Pi as a host process; root only for
# the image build.
test-pi-contract: image
	$(GO) test $(RACE) -count=1 -v ./test/picontract

e2e-pi: runsc image
	$(GO) test $(RACE) -count=1 -v -run '^TestPi' -skip '^TestPi($(E2E_CONTINUITY))$$' ./test/e2e

# Continuity through the supervisor: 20 mid-turn disconnects with the fake
# Pi, fencing, duplicate inputs, peer checks, a supervisor killed mid-turn
# (its sandbox adopted from its holder), the Docker topology, then the real
# Pi surviving dropped connections, a killed client process and a
# supervisor restart, and the official container's daemon (its own mount,
# pid and network namespaces, uid 1000, the socket file alone) through a
# supervisor restart. Root.
e2e-continuity: runsc image
	$(GO) test $(RACE) -count=1 -v ./runtime/supervisor
	$(GO) test $(RACE) -count=1 -v -run '^TestPi($(E2E_CONTINUITY))$$' ./test/e2e

# Paseo as it ships, with `paseo-policy pi` as its Pi command (docs/paseo.md):
# test/paseoharness launches the command as Paseo's PiCliRuntime does, as the
# daemon user with other providers' keys in its environment, against the real
# Pi in gVisor: a probe, a turn with tool calls, a refused launch, a SIGKILL
# of the daemon's process tree mid-turn and the respawn that gets the rest,
# a deliberate close; the same harness against the image's Pi run on the
# host is the control; and a turn and a refusal from inside the official
# container's topology. Root.
e2e-paseo: runsc image
	$(GO) test $(RACE) -count=1 -v -run '^TestPaseo' ./test/e2e

# The TypeScript client (clients/typescript): `npm run test:unit` (node's test runner, tsc
# from the package's lock; scripted Pi streams and a scripted supervisor: untrusted frames,
# line bounds, UTF-8, timeouts) and `npm run test:e2e` against the real `paseo-policy
# supervise` and the real Pi in gVisor, in the world test/e2e TestTypeScriptClient builds:
# a turn with a tool call, dropped connections and a supervisor SIGKILL mid-turn, a replay
# from a persisted cursor, hibernate and wake, steer and interrupt, a refused facts set's
# diagnostics as data. Fails if either run passes nothing or anything skipped. Root.
e2e-ts: runsc image
	$(GO) test $(RACE) -count=1 -v -run '^TestTypeScriptClient$$' ./test/e2e

# The plan rendered for Kubernetes (docs/kubernetes.md), in test/kubernetes,
# a module of its own (k8s.io/kubernetes and its staging replaces stay out
# of the product's go.mod): the golden renderings through the apiserver's
# validation and the Pod Security checks, and the rendered Pod run by a
# containerd of the test's own through the CRI on the runsc shim, and a
# real Pi turn in that Pod through the cluster gateway (the Pi image: its
# layer is cached in the user's cache dir between runs). Root.
kubernetes: runsc shim containerd image
	cd test/kubernetes && GOWORK=off $(GO) vet ./...
	cd test/kubernetes && GOWORK=off $(GO) test $(RACE) -count=1 -timeout 30m -v ./...

# The escape probe as a plain host process (control: every escape must
# succeed) and under the launcher (contained: none may), plus one sandbox
# per resource limit; writes out/acceptance.json and fails unless it is a
# pass. Root, like the launcher tests.
acceptance: runsc
	$(GO) test $(RACE) -count=1 -timeout 40m -v -run '^TestAcceptance$$' ./test/acceptance

# Each fuzz target runs a bounded number of executions (about 5-10 s here);
# a finding fails the build and leaves its input under testdata/fuzz for
# the regression run in `unit`. Counts, not durations: go1.26's fuzz
# coordinator can report "context deadline exceeded" as a failure when a
# duration runs out while a worker is busy (golang/go#75804, fixed in 1.27),
# which failed a CI run of FuzzResolve with no crasher.
FUZZ_FAST ?= 300000x
FUZZ_CUE ?= 5000x
# Each execution of FuzzRouteAgainstStandIn is an HTTP round trip through
# the route proxy to the Node stand-in of Paseo's endpoint (about 1000 a
# second on 2 cores).
FUZZ_STANDIN ?= 5000x
fuzz:
	$(GO) test -run=^$$ -fuzz=^FuzzLoadFacts$$ -fuzztime=$(FUZZ_CUE) ./policy/schema
	$(GO) test -run=^$$ -fuzz=^FuzzLoadCUEFacts$$ -fuzztime=$(FUZZ_CUE) ./policy/schema
	$(GO) test -run=^$$ -fuzz=^FuzzCheck$$ -fuzztime=$(FUZZ_FAST) ./internal/pathform
	$(GO) test -run=^$$ -fuzz=^FuzzDecodeList$$ -fuzztime=$(FUZZ_FAST) ./policy/grant
	$(GO) test -run=^$$ -fuzz=^FuzzResolve$$ -fuzztime=$(FUZZ_FAST) ./internal/pathsafe
	$(GO) test -run=^$$ -fuzz=^FuzzGitlinks$$ -fuzztime=$(FUZZ_FAST) ./internal/gitindex
	$(GO) test -run=^$$ -fuzz=^FuzzSplice$$ -fuzztime=$(FUZZ_FAST) ./runtime/launcher/fsmonitor/untracked
	$(GO) test -run=^$$ -fuzz=^FuzzHost$$ -fuzztime=$(FUZZ_FAST) ./internal/netdest
	$(GO) test -run=^$$ -fuzz=^FuzzIndentCompact$$ -fuzztime=$(FUZZ_FAST) ./policy/bundle
	$(GO) test -run=^$$ -fuzz=^FuzzBodyPolicy$$ -fuzztime=$(FUZZ_FAST) ./runtime/launcher/routeproxy
	$(GO) test -run=^$$ -fuzz=^FuzzRouteAgainstStandIn$$ -fuzztime=$(FUZZ_STANDIN) ./runtime/launcher/routeproxy

bench: build
	./scripts/bench.sh

# Rewrite golden files after an intended change; review the diff. The CLI's
# explain and diff goldens are of the compiler's golden bundles: compiler
# first.
golden:
	PASEO_UPDATE=1 $(GO) test -count=1 ./policy/compiler/
	PASEO_UPDATE=1 $(GO) test -count=1 ./cli/

clean:
	rm -rf $(BIN) .demo

# Launcher start-up against bare runsc, and sandbox network setup time
# (root; see scripts/bench-launch.sh and docs/benchmarks.md).
bench-launch: runsc
	./scripts/bench-launch.sh

# The sandbox rootfs (Debian bookworm minbase, Node, Pi, pi-mcp-adapter),
# built from the registries this machine's apt and npm are configured for;
# writes .image/rootfs and .image/image.json (version, digest). Root. See
# docs/image.md.
image:
	image/build.sh $(CURDIR)/.image

# Output throughput through the bridge against a raw pipe, and replay time
# for a 1 MiB backlog (see scripts/bench-bridge.sh and docs/benchmarks.md).
bench-bridge:
	./scripts/bench-bridge.sh

# The real Pi's start up to its first RPC response, sandboxed against the
# same Pi on the host, and what the sandbox's share goes to (root; see
# scripts/bench-pi.sh and docs/benchmarks.md).
bench-pi: runsc image
	./scripts/bench-pi.sh

# An agent's tools (git, rg, find, fd, cat, writes, node) on a generated
# 20,000-file repository in one sandbox against the same commands on the
# host, in one run (root; see scripts/bench-tools.sh and docs/benchmarks.md).
bench-tools: runsc image
	./scripts/bench-tools.sh
