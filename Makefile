# The commands a developer and CI run. Every target that needs a pinned tool (bin/) builds
# the missing ones first (hack/tools/install.sh: a few minutes per tool on a cold machine,
# under a second when they are cached), so `make dev` and `make test` work on a fresh clone
# in either order. PROXYFLEET_TOOLS_CACHE moves the tool cache (default
# ~/.cache/proxyfleet-tools).
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO        ?= go
BIN       := $(CURDIR)/bin
GOTEST    ?= $(GO) test
TEST_FLAGS ?= -race -count=1 -timeout 30m
PKGS      ?= ./...

# Generated files: `make check-generated` fails when they differ from what the sources give.
GENERATED := deploy/crd deploy/rbac operator/api/v1alpha1/zz_generated.deepcopy.go

.PHONY: all tools deps build dev test-e2e generate generate-files check-generated lint fmt vet test soak help bench chaos chaos-short fuzz record-histories

all: generate lint test

help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

tools: ## build the pinned temporal CLI, envtest binaries, controller-gen and linters into bin/
	hack/tools/install.sh
	ln -sfn k8s/kubectl $(BIN)/kubectl

deps: ## install the Debian packages the tests run (squid) when missing; not root: prints the command
	hack/deps/apt.sh

build: ## build the project's binaries into bin/
	$(GO) build -o $(BIN)/ ./cmd/...

dev: tools build ## run the whole system on 127.0.0.1 (Web UI, API server, proxies, operator, worker, discovery) until Ctrl-C
	$(BIN)/devstack

test-e2e: tools build ## run `make dev` as a user would and drive it with the printed commands
	$(GOTEST) -count=1 -tags devstack -timeout 20m ./internal/devstack/

define GENERATE
	$(BIN)/controller-gen object paths=./operator/api/...
	$(BIN)/controller-gen crd paths=./operator/api/... output:crd:artifacts:config=deploy/crd
	$(BIN)/controller-gen rbac:roleName=proxyfleet-operator paths=./operator/... output:rbac:artifacts:config=deploy/rbac/operator
	$(BIN)/controller-gen rbac:roleName=proxyfleet-worker paths=./activities/... output:rbac:artifacts:config=deploy/rbac/worker
endef

generate: tools ## regenerate deepcopy, the CRD and RBAC from the Go sources
	$(GENERATE)

# generate without the tools check, for targets that have just made it.
generate-files:
	$(GENERATE)

check-generated: tools ## fail when generated files are stale (compares against a fresh generation)
	@snap=$$(mktemp -d); trap 'rm -rf "$$snap"' EXIT; \
	tar -cf "$$snap/before.tar" $(GENERATED); \
	$(MAKE) --no-print-directory generate-files >/dev/null; \
	mkdir "$$snap/before" && tar -xf "$$snap/before.tar" -C "$$snap/before"; \
	if ! diff -r "$$snap/before/deploy/crd" deploy/crd >/dev/null || \
	   ! diff -r "$$snap/before/deploy/rbac" deploy/rbac >/dev/null || \
	   ! diff "$$snap/before/operator/api/v1alpha1/zz_generated.deepcopy.go" operator/api/v1alpha1/zz_generated.deepcopy.go >/dev/null; then \
		echo "generated files were stale; they are regenerated now: review and commit them"; exit 1; \
	fi

fmt: ## gofmt the tree
	gofmt -w $$(git ls-files '*.go')

vet:
	$(GO) vet $(PKGS)

lint: tools check-generated vet ## gofmt, go vet, workflowcheck, staticcheck, generated files, the Python package compiles
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(BIN)/workflowcheck ./workflows/...
	$(BIN)/staticcheck $(PKGS)
	$(GO) vet -tags chaos,devstack ./internal/chaos/ ./internal/devstack/
	$(BIN)/staticcheck -tags chaos,devstack ./internal/chaos/ ./internal/devstack/
	@# The Python package: it must at least compile (Debian's python3, as its tests use).
	@# Its bytecode goes to a directory of its own: nothing is written into (or removed
	@# from) the source tree, whose caches the Python tests may be using meanwhile (CI).
	@pyc=$$(mktemp -d); trap 'rm -rf "$$pyc"' EXIT; \
	PYTHONPYCACHEPREFIX="$$pyc" python3 -m compileall -q discovery/client/python >/dev/null

E2E_PKG   ?= ./internal/e2e/...
E2E_FLAGS ?= -count=1 -timeout 30m

test: deps tools check-generated vet ## vet, unit and integration tests (-race), the soak, then end-to-end tests on the real stack
	$(GOTEST) $(TEST_FLAGS) $$($(GO) list $(PKGS) | grep -v '/internal/e2e\(/\|$$\)')
	$(MAKE) --no-print-directory soak
	$(GOTEST) $(E2E_FLAGS) $(E2E_PKG)

SOAK_DAYS ?= 90
soak: ## one Proxy through SOAK_DAYS simulated days in Temporal's time-skipping test environment (seconds)
	SOAK_DAYS=$(SOAK_DAYS) $(GOTEST) -count=1 -timeout 10m -run '^TestMonthsInMinutes$$' ./workflows/

bench: tools ## benchmarks with the figures reported in docs/benchmarks.md (minutes; not part of make test)
	$(GO) test ./discovery ./activities/probe -run '^$$' -bench . -benchtime 20000x
	$(GO) test ./internal/benchmarks -run '^$$' -bench . -benchtime 1x -timeout 60m

CHAOS_PROXIES ?= 100
chaos: tools ## fault suite: kill -9 and restart each server while CHAOS_PROXIES Proxies churn (minutes)
	CHAOS_PROXIES=$(CHAOS_PROXIES) $(GOTEST) -count=1 -tags chaos -timeout 60m -v -run . ./internal/chaos/

chaos-short: ## the fault suite on a fleet of 20 (CI runs it)
	$(MAKE) --no-print-directory chaos CHAOS_PROXIES=20

FUZZTIME ?= 30s
fuzz: ## run every fuzz target for FUZZTIME each (their seed corpora also run in make test)
	$(GO) test ./discovery -run '^$$' -fuzz '^FuzzDecodeLeaseRequest$$' -fuzztime $(FUZZTIME)
	$(GO) test ./discovery -run '^$$' -fuzz '^FuzzParseQuerySelector$$' -fuzztime $(FUZZTIME)

RECORD_TESTS = TestProxyLifecycle|TestDeleteWhileProvisioning|TestCloudInitSecretNeverInHistory|TestTerminatedRunIsRestartedAndAdopts|TestTimersReportsAndBans|TestQuotaThenPermanentFailure|TestContinuedRun|TestScheduledGCDeletesExactlyTheOrphans|TestExternalProxyBehindRealSquid|TestKilledInstanceIsDetectedAndRecreated|TestWorkerKeepsItsMonitorShards|TestPoolBannedEverywhereReplacesWithinTheSurge|TestPoolRollsASecretRotationWithinTheSurge|TestAWSProxyLifecycle
record-histories: tools ## record histories of real runs into workflows/testdata/histories/v<latest> (older versions' stay)
	RECORD_HISTORIES=1 $(GO) test ./internal/e2e/... -run '^($(RECORD_TESTS))$$' -count=1
