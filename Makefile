# podvm — run `make help` for the targets.
SHELL := /bin/bash
GO    ?= go

.PHONY: help test unit lint generate check-generate bench

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

test: lint unit ## every test (unit and integration)

unit: ## unit tests with the race detector
	$(GO) test -race -count=1 ./...

lint: ## gofmt, go vet, tag-free builds with and without cgo
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt would change: $$out"; exit 1; }
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=1 $(GO) build ./...

generate: ## regenerate the mocks
	$(GO) generate ./...

check-generate: generate ## fail if the committed mocks are stale
	@git diff --exit-code -- '*mock*' || { echo "mocks are stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- '*mock*')" || { echo "untracked mocks: commit them"; exit 1; }

bench: ## benchmarks with ratios against the alternatives
	$(GO) test -run '^$$' -bench . -benchmem ./exec/
