# podvm — run `make help` for the targets.
SHELL := /bin/bash
GO    ?= go
# Podman is required (a missing one fails instead of skipping) under CI.
export PODVM_REQUIRE_PODMAN ?= $(if $(filter true,$(CI)),1,)

# Runs a recipe line with the project's Podman service in the environment:
# CONTAINER_HOST, PODVM_TEST_IMAGE and, where needed, CONTAINERS_CONF.
# Without Podman, integration tests skip, or fail when it is required.
WITH_PODMAN = if env=$$(scripts/podman-up.sh); then eval "$$env"; \
	elif [ "$$PODVM_REQUIRE_PODMAN" = 1 ]; then echo "podman is required here (CI=true or PODVM_REQUIRE_PODMAN=1)"; exit 1; \
	else echo "no podman: integration tests will skip"; fi

# The same for the Kubernetes cluster of `make kube` (root only: it runs a
# kubelet), for vm/kube's tests and the bench's kube section; its binaries
# are built once per machine and cached outside the clone.
export PODVM_REQUIRE_KUBE ?= $(if $(filter true,$(CI)),1,)
WITH_KUBE = if [ "$$(id -u)" = 0 ] && env=$$(scripts/kube-up.sh); then eval "$$env"; \
	elif [ "$$PODVM_REQUIRE_KUBE" = 1 ]; then echo "a Kubernetes cluster is required here (CI=true or PODVM_REQUIRE_KUBE=1): make kube"; exit 1; \
	else echo "no Kubernetes cluster: vm/kube's integration tests and the bench's kube section will skip"; fi

.PHONY: help demo test test-matrix fuzz unit lint generate check-generate bench podman podman-down check-leaks podman5 podman5-down kube kube-down kube-smoke

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# The demo's fork part needs a Podman whose CRIU can checkpoint: the
# project's service (Debian 12's Podman 4.3) cannot, and the demo says
# why; as root, the Podman 5.4 service of `make podman5` (CRIU 4.1) is
# brought up too, and the fork shown there.
demo: ## compile and run a Go program in a sandbox, through both backends side by side, then fork a warm process where Podman can checkpoint (brings Podman up first)
	@env=$$(scripts/podman-up.sh) || { echo "make demo needs Podman: see the messages above"; exit 1; }; eval "$$env"; \
	$(GO) build -o .podvm/demo ./examples/demo && .podvm/demo -warm && .podvm/demo || exit 1; \
	if [ "$$(id -u)" != 0 ]; then echo "the fork on Podman 5.4 needs root to bring that service up: skipped"; exit 0; fi; \
	echo; echo "Podman 5.4 with CRIU 4.1 (scripts/podman5-up.sh), where checkpoints work:"; \
	env5=$$(scripts/podman5-up.sh) || { echo "the Podman 5.4 service did not come up: see the messages above"; exit 1; }; \
	eval "$$env5"; .podvm/demo -forks -url "$$CONTAINER_HOST"

# go test's -timeout is per package: at least twice what the slowest (vm,
# 12 min under a cold machine's load) takes; a hung case is caught sooner,
# by its own watchdog (vm/vmtest). -p 1: one package at a time. vm and
# vm/kube side by side drove two cores to a load of 20-32, where a kill's
# podman exec outran its grace and cases their deadlines. vm's parity
# records APIVM's observations (.podvm/parity.rec, made afresh each run)
# and vm/kube's compares the kube backend with them, instead of running
# every case on Podman again (vmtest.RecordEnv).
test: lint check-generate ## every test: unit and integration against a real Podman and a real Kubernetes, then a leak check
	@$(WITH_PODMAN); $(WITH_KUBE); \
	$(GO) run ./internal/testreap || exit 1; \
	mkdir -p .podvm && CGO_ENABLED=0 $(GO) build -buildvcs=false -o .podvm/unixecho ./vm/vmtest/testdata/unixecho || exit 1; \
	export PODVM_UNIXECHO=$$PWD/.podvm/unixecho; \
	rm -f .podvm/parity.rec; \
	PODVM_PARITY_RECORD=$$PWD/.podvm/parity.rec $(GO) test -race -count=1 -p 1 -timeout 30m -v ./... >.podvm-test.log 2>&1; rc=$$?; \
	grep -vE '^ *(=== (RUN|PAUSE|CONT|NAME)|--- (PASS|SKIP)|PASS$$)' .podvm-test.log; \
	scripts/conformance-table.sh .podvm-test.log || rc=1; \
	if command -v podman >/dev/null; then scripts/check-leaks.sh || rc=1; fi; exit $$rc

test-matrix: ## every conformance case on both backends (the parity test) on Podman 4.3 and 5.4, as a compatibility table (root)
	@scripts/test-matrix.sh

unit: ## unit tests only (integration tests skip without CONTAINER_HOST)
	env -u CONTAINER_HOST PODVM_REQUIRE_PODMAN= $(GO) test -race -count=1 ./...

lint: ## gofmt, go vet, tag-free builds with and without cgo
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt would change: $$out"; exit 1; }
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=1 $(GO) build ./...

FUZZTIME ?= 20s
fuzz: ## run every fuzz target for FUZZTIME each (default 20s); found inputs land in testdata/fuzz
	@set -e; for pkg in $$($(GO) list ./...); do \
		list=$$($(GO) test -list '^Fuzz' $$pkg) || exit 1; \
		for f in $$(echo "$$list" | grep '^Fuzz'); do \
			echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

generate: ## regenerate the mocks and the embedded agent binaries (internal/agent/bin, reproducible)
	$(GO) generate ./...

check-generate: generate ## fail if the committed mocks or agent binaries are stale
	@git diff --exit-code --stat -- '*mock*' internal/agent/bin || { echo "generated files are stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- '*mock*' internal/agent/bin)" || { echo "uncommitted generated files: commit them"; exit 1; }

# BENCH_PODMAN5=1 runs the bench against the Podman 5.4 service of `make
# podman5` (brought up if need be; root), with its own CLI: the only one
# here whose CRIU can checkpoint, which the checkpoint section needs (it
# skips, saying why, elsewhere). The cluster is brought up only when the
# kube section runs.
bench: ## benchmarks: exec's overhead, then podvm against the podman CLI, Podman's bindings and runc, and vm/kube against kubectl on the cluster of make kube, in one run (BENCH_QUICK=1: a short smoke run; BENCH_ONLY=kube,checkpoint,...: some sections; BENCH_PODMAN5=1: on Podman 5.4)
	$(GO) test -run '^$$' -bench . -benchmem ./exec/
	@if [ "$${BENCH_PODMAN5:-}" = 1 ]; then env=$$(scripts/podman5-up.sh) || { echo "BENCH_PODMAN5=1: the Podman 5.4 service did not come up"; exit 1; }; \
		eval "$$env"; export PODMAN=$$PWD/scripts/podman5-cli; else $(WITH_PODMAN); fi; \
	case "$${BENCH_ONLY:-kube}" in *kube*) $(WITH_KUBE);; esac; cd bench && $(GO) run -tags 'remote containers_image_openpgp exclude_graphdriver_btrfs' .

podman: ## bring up the project's Podman service and test image (idempotent)
	@scripts/podman-up.sh

podman-down: ## stop only what `make podman` started
	@scripts/podman-down.sh

podman5: ## bring up a Podman 5.4 service beside the 4.3 one, in a trixie rootfs (root; idempotent)
	@scripts/podman5-up.sh

podman5-down: ## stop only what `make podman5` started (keeps the rootfs cache)
	@scripts/podman5-down.sh

kube: ## bring up a real one-node Kubernetes and the test image (root; first run builds 8-16 min, cached outside the clone; idempotent)
	@scripts/kube-up.sh

kube-down: ## stop only what `make kube` started and undo its host changes (keeps the binary cache)
	@scripts/kube-down.sh

kube-smoke: ## check the cluster of `make kube` with kubectl: pods, attach, exec, limits, NetworkPolicy (brings it up first)
	@scripts/kube-smoke.sh

check-leaks: ## fail if any podvm sandbox container is left
	@scripts/check-leaks.sh
