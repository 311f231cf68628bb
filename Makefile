# The two commands a newcomer needs are `make run` and `make test`;
# `make help` lists the twelve public targets. The rest are named for what
# they belong to: check-* are the parts of `make check`, bench-* the Go
# benchmarks beside `make bench`; each runs alone too.

.PHONY: help run test check check-fast generate rename bench fuzz soak soak-failover ha screenshots \
	check-static check-tools check-docs-ui check-spec check-generated check-vet check-staticcheck check-gosec \
	check-docs check-walkthrough check-exercises check-model check-rename check-fuzz bench-go bench-sweeper

# The public targets, one line each.
help:
	@echo 'make run            the demo at http://127.0.0.1:8080/ (PORT=8081 for another port)'
	@echo 'make test           the whole suite, against a real PostgreSQL'
	@echo 'make check          what CI runs: every static check (check-static), then make test'
	@echo 'make check-fast     between edits: drift, vet, linters, the tests of changed packages'
	@echo 'make generate       regenerate the committed code (oapi-codegen, sqlc, River, the package map)'
	@echo 'make rename         MODULE=example.com/you/shop: make the fork yours (docs/forking.md)'
	@echo 'make bench          the database work and the rates of keyed requests (docs/performance.md)'
	@echo 'make fuzz           fuzz every parser of hostile input, 200,000 inputs each'
	@echo 'make soak           the chaos soak for ten minutes (SOAK=5m for another length)'
	@echo 'make soak-failover  the soak against a Patroni cluster whose leader is killed'
	@echo 'make ha             a highly available PostgreSQL for development; STOP=1 stops it'
	@echo 'make screenshots    the demo page at 1280x800 and 390x844, from its browser test, for the README'
	@echo 'The parts of make check (check-*) and the Go benchmarks (bench-*) run alone too.'

# Run the demo on 127.0.0.1:8080 (PORT=8081 for another port) against the local PostgreSQL (the database is
# created if missing and migrated): the API, the demo page, the spec, the
# fake processor, and DEMO_MODE's /demo endpoints, with the server restarted
# whenever the demo crashes it. DEMO_MODE is for this command only.
run:
	$(if $(PORT),HTTP_ADDR=127.0.0.1:$(PORT)) go run ./cmd/server demo

# The whole test suite, against a real PostgreSQL (127.0.0.1:5432 by default;
# set TEST_DATABASE_URL to use another). Each test gets its own database.
# gotestsum (pinned in tools/go.mod) prints each package as it finishes,
# then every skipped test with its reason, every failure, and the totals.
# Under CI=true a test that would skip for a missing tool fails instead.
# The two longest packages are named first, so that they start at once and
# the short ones fill the other core around them instead of queueing in
# front of the soak (./... lists each package once).
test:
	go tool -modfile=tools/go.mod gotestsum --format pkgname --format-hide-empty-pkg -- -race -count=1 ./internal/soak ./internal/app ./...

# Tools from the npm registry, at pinned versions, into .cache/ (ignored by
# git): axe-core for the browser tests' accessibility check, Redocly's CLI
# to lint the spec, and Mermaid's bundle (alone: it needs none of its
# dependencies) to draw docs/learn.md's diagram.
check-tools:
	npm install --no-save --silent --prefix .cache/npm axe-core@4.14.1 @redocly/cli@2.77.0
	test -f .cache/mermaid/mermaid-$(MERMAID_VERSION).tgz || (rm -rf .cache/mermaid && mkdir -p .cache/mermaid && \
		cd .cache/mermaid && npm pack --silent mermaid@$(MERMAID_VERSION) >/dev/null && \
		tar xzf mermaid-$(MERMAID_VERSION).tgz package/dist/mermaid.min.js)
MERMAID_VERSION = 12.3.0

# The API reference's renderer, Redoc, served at /docs/: its standalone
# bundle from the npm registry at a pinned version (npm checks the
# package's integrity), copied into web/docs/ and committed, so that the
# server embeds it and the page asks no other host for anything. One change
# is made to it: the small logo Redoc would fetch from cdn.redoc.ly for its
# "API docs by Redocly" credit becomes an empty inline image (the credit's
# text and link stay).
REDOC_VERSION = 2.5.2
REDOC_LOGO = https://cdn.redoc.ly/redoc/logo-mini.svg
EMPTY_SVG = data:image/svg+xml,%3Csvg xmlns=%27http://www.w3.org/2000/svg%27 width=%271%27 height=%271%27/%3E
# Fetch the pinned Redoc bundle into web/docs/ (commit the result after a
# version change), and fail if it differs from what is committed.
check-docs-ui:
	rm -rf .cache/redoc && mkdir -p .cache/redoc
	cd .cache/redoc && npm pack --silent redoc@$(REDOC_VERSION) >/dev/null && tar xzf redoc-$(REDOC_VERSION).tgz
	grep -qF '"$(REDOC_LOGO)"' .cache/redoc/package/bundles/redoc.standalone.js
	sed 's|"$(REDOC_LOGO)"|"$(EMPTY_SVG)"|' .cache/redoc/package/bundles/redoc.standalone.js > web/docs/redoc.standalone.js
	cp .cache/redoc/package/LICENSE web/docs/redoc.LICENSE
	@git diff --exit-code -- web/docs || \
		(echo "web/docs differs from redoc@$(REDOC_VERSION): commit the result" >&2; exit 1)

# Lint the spec with Redocly's recommended-strict rules and the API's own
# (redocly.yaml): zero findings.
check-spec: check-tools
	.cache/npm/node_modules/.bin/redocly lint --config redocly.yaml api/openapi.yaml

# What CI runs (.ci/run): the static checks, then the tests.
check: check-static test

# The quick check, between edits: generated-code drift, vet, staticcheck
# and gosec over the whole module, then the tests of the packages changed
# since BASE (main by default; committed, uncommitted and untracked files
# alike, see scripts/changed-packages.sh). No npm, no model, no renamed
# copy, no other package's tests: `make check` is still the gate.
BASE = main
check-fast: check-generated check-vet check-staticcheck check-gosec
	@pkgs=$$(bash scripts/changed-packages.sh $(BASE)); \
	if [ -z "$$pkgs" ]; then \
		echo "check-fast: no Go package changed since $(BASE)"; \
	else \
		echo "check-fast: go test -race -count=1" $$pkgs; \
		go test -race -count=1 $$pkgs; \
	fi

# Everything but the tests: generated-code and Redoc drift, the spec's
# lint, vet, staticcheck, gosec, the docs' commands, the keyed operation
# of docs/adding-an-operation.md added to a copy of the tree, the lease
# protocol's model, the breaks of docs/exercises.md, and a renamed copy of
# the module (the three copies run tests, so they need PostgreSQL too).
check-static: check-generated check-docs-ui check-spec check-vet check-staticcheck check-gosec check-docs check-walkthrough check-exercises check-model check-fuzz check-rename

# Regenerate the committed code, after checking (before writing anything)
# that each query file has one package calling it: oapi-codegen (api/openapi.yaml ->
# internal/apigen and client/apiclient), River's migrations (the River in
# go.mod -> db/migrations/*_river_*, see internal/postgres/river.go) and sqlc
# (db/ -> internal/dbsqlc). The tools are pinned in tools/go.mod, apart
# from the service's own module, and run with
# `go tool -modfile=tools/go.mod`. Then the map of the packages in
# docs/architecture.md, from the import graph (make check-docs fails while
# it is stale).
generate:
	bash scripts/architecture.sh --owners
	go generate ./...
	bash scripts/architecture.sh --write

# Fail if the generated code is not what the sources generate, as the
# working tree has them (committed or not; see the script).
check-generated:
	bash scripts/check-generated.sh

# go vet over the whole module.
check-vet:
	go vet ./...

# staticcheck over the whole module (pinned in tools/go.mod, run with `go tool`).
check-staticcheck:
	go tool -modfile=tools/go.mod staticcheck ./...

# The security linter (pinned in tools/go.mod, run with `go tool`): zero
# findings. Each one is fixed, or excluded where it stands with
# `#nosec RULE -- why`. Generated code is left out (its input is checked),
# and so is cmd/bench, a load generator of its own module that nothing
# deploys (gosec walks directories, not modules): it picks keys with
# math/rand and runs the binaries it builds.
check-gosec:
	go tool -modfile=tools/go.mod gosec -quiet -exclude-generated -exclude-dir=cmd/bench ./...

# Run the commands of the docs' sh blocks, and the tour (docs/tour.md) against
# a fresh demo (its outputs compared with the tour's), so the walkthroughs
# cannot rot; check the docs' links and the tests they name, and that the
# map in docs/architecture.md is the code's (scripts/architecture.sh
# --check: the import graph, and one owner per query file).
check-docs:
	bash scripts/check-docs.sh

# Follow the keyed operation of docs/adding-an-operation.md word for word
# on a temporary copy of the tree: apply the doc's blocks (each names its
# file in its info string), run its commands, and fail if git status shows
# a file the doc does not name; then, in the copy, gofmt, go build, vet,
# staticcheck, gosec, the spec's lint, the map's check, and the tests the
# change can break (scripts/check-walkthrough.sh says which, and why not
# all of them). Needs PostgreSQL, and Redocly (hence npm-tools).
check-walkthrough: check-tools
	bash scripts/check-walkthrough.sh

# Remove each guard docs/exercises.md breaks, on a copy of the tree, and
# check that the command the exercise names then fails.
check-exercises:
	bash scripts/check-exercises.sh

# Model-check the lease protocol (model/idempotency.pml) with spin: safety
# (every assertion, in every reachable state, every statement reached) and
# liveness under weak fairness must find nothing, and the two planted bugs
# (NO_FENCE, NO_TIMER) must be caught, their counterexamples printed. The
# verifiers are built in .cache/model (docs/reliability.md).
check-model:
	bash scripts/check-model.sh

# For a fork: rename the Go module everywhere, and the name the project goes
# by (its database, metric prefix, image and the fake processor's
# User-Agent; NAME defaults to the module's last element):
# `make rename MODULE=example.com/you/shop [NAME=shop]` (docs/forking.md).
rename:
	@test -n "$(MODULE)" || \
		(echo "MODULE is not set: use 'make rename MODULE=example.com/you/shop [NAME=shop]'" >&2; exit 1)
	bash scripts/rename-module.sh "$(MODULE)" $(NAME)

# Rename a temporary copy of the tree and build, vet and test it (needs PostgreSQL).
check-rename:
	bash scripts/check-rename.sh

# What a keyed request costs the database (round trips, commits, tuples,
# WAL) and its rate beside a plain insert and the service's own statements
# through pgx, in one run (docs/performance.md). The bench is a module of
# its own (cmd/bench/go.mod): its load generator and toxiproxy stay out of
# the service's go.mod. BENCH_ARGS='-db-latency=500us' puts the database
# a network hop away; '-baseline=BIN' compares with another server binary
# in the same run; '-sizes=' skips the growth with 10k-10M stored keys.
bench:
	cd cmd/bench && go run . $(BENCH_ARGS)

# Go benchmarks of the hot path through HTTP, with statements per request
# (docs/performance.md). They live with the end-to-end tests, in
# internal/app, and run the service that app.New builds.
bench-go:
	go test -run='^$$' -bench=. -benchtime=3s ./internal/app/

# Sweep 1,000,000 expired records while claiming new keys; reports records/s
# and the claims' p99 (docs/performance.md).
bench-sweeper:
	go test -run='^$$' -bench=SweepMillion -benchtime=1x ./internal/sweeper/

# Fuzz what parses hostile input, 200,000 inputs each: the Idempotency-Key parser, the
# fingerprint's canonical JSON (same document, same fingerprint; any value
# changed, another), the body check (ends, allocates in proportion to its
# input) and its unescaping (reads strings as encoding/json does), and
# webhook signatures.
# Crashers land in each package's testdata/fuzz and become seeds.
# The budget is a count of inputs, not a duration: Go 1.26's coordinator can
# fail a duration-limited run with a bare "context deadline exceeded" when
# the deadline lands while a worker is mid-input (golang/go#75804, fixed in
# 1.27), which is a flake, not a finding. A count has no deadline to race.
FUZZTIME = 200000x
fuzz:
	go test -run='^$$' -fuzz='^FuzzParseKey$$' -fuzztime=$(FUZZTIME) ./internal/idempotency/
	go test -run='^$$' -fuzz='^FuzzFingerprint$$' -fuzztime=$(FUZZTIME) ./internal/idempotency/
	go test -run='^$$' -fuzz='^FuzzCheck$$' -fuzztime=$(FUZZTIME) ./internal/ijson/
	go test -run='^$$' -fuzz='^FuzzVerify$$' -fuzztime=$(FUZZTIME) ./internal/cardprocessor/

# The chaos soak (internal/soak) for ten minutes, with its summary; `make
# test` runs it for 30 seconds. SOAK=5m to change the length.
SOAK = 10m
soak:
	@mkdir -p .cache
	go test -race -count=1 -v -run '^TestSoak$$' -timeout 60m ./internal/soak/ -soak.duration=$(SOAK) -soak.summary=$(CURDIR)/.cache/soak-summary.txt
	@cat .cache/soak-summary.txt

# The failover soak (internal/soak, TestFailoverSoak) with five minutes of
# load: the chaos soak's load against a Patroni cluster whose leader is
# killed twice (docs/operations.md). `make test` runs it with 30 seconds.
# SOAK_FAILOVER=10m to change the length.
SOAK_FAILOVER = 5m
soak-failover:
	@mkdir -p .cache
	bash scripts/ha.sh install
	go test -race -count=1 -v -run '^TestFailoverSoak$$' -timeout 60m ./internal/soak/ -soak.failover-duration=$(SOAK_FAILOVER) -soak.summary=$(CURDIR)/.cache/soak-failover-summary.txt
	@cat .cache/soak-failover-summary.txt

# A highly available PostgreSQL for development (docs/operations.md): etcd
# and three Patroni-managed nodes with synchronous replication, every file
# in $(HA_DIR), loopback ports only. It prints the DATABASE_URL to give the
# server; `make ha STOP=1` stops every process it started.
HA_DIR = .cache/ha
ha:
ifdef STOP
	bash scripts/ha.sh stop $(HA_DIR)
else
	@mkdir -p .cache
	bash scripts/ha.sh install
	bash scripts/ha.sh start $(HA_DIR) >/dev/null
	@echo "The cluster is up (bash scripts/ha.sh status $(HA_DIR)). Run the server on it with:"
	@echo "  DATABASE_URL='$$(bash scripts/ha.sh url $(HA_DIR) payments)' make run"
	@echo "Stop it with: make ha STOP=1"
endif

# The demo's screenshots (docs/screenshots/), taken by the browser test
# that checks the page's layout after each step of the crash story.
screenshots:
	SCREENSHOTS=$(CURDIR)/docs/screenshots go test -count=1 -run '^TestDemoPageAtBothSizes$$' ./internal/app/

# CI's short fuzz: each target for 20,000 inputs (a few seconds) beyond its seeds (which every
# `make test` runs). A crasher fails CI and is written to the package's
# testdata/fuzz, to be committed as a seed with its fix.
check-fuzz:
	$(MAKE) fuzz FUZZTIME=20000x
