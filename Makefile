# rlbox developer and CI entry points. `make help` lists them.
# The Python: this checkout's own virtualenv (.venv, made by `make setup`), so checkouts never
# re-point each other's `rlbox`; `. .venv/bin/activate` puts `rlbox` on your PATH.
VENV   = export PATH="$(CURDIR)/.venv/bin:$$PATH";
PYTHON = $(VENV) "$(CURDIR)/.venv/bin/python"
RLBOX  = $(PYTHON) -m rlbox.cli
FLAGSHIP ?= verl_pt27_25rc3
BUILD_FLAGS ?=
REF ?=

SIM_VARIANT := $(shell uname -m | sed -e 's/x86_64/amd64/' -e 's/aarch64/arm64/')
CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)

.PHONY: help setup test lint dockerfiles check-dockerfiles image image-a2 image-a3 image-ax bench bench-quick docs rehearsal sim-image rehearse-image

# `make help` lists every target, one a line (tests/test_make.py holds it to the rules below).
help:
	@echo "make help               this list"
	@echo "make rehearsal          4-node simulated Atlas A3 cluster: 64 NPUs in Ray, smoke-test job, teardown"
	@echo "make test               the whole test suite (engine tests included; what CI runs: .ci/run)"
	@echo "make setup              provision Docker engine + buildx + sshd, install rlbox into .venv (every target below runs it)"
	@echo "make lint               hadolint over every rendered Dockerfile + render --check + lock --check"
	@echo "make dockerfiles        re-render dockerfiles/ from images/, templates/, patches/"
	@echo "make check-dockerfiles  render --check + lock --check (without hadolint)"
	@echo "make docs               build the manual (docs/, mkdocs.yml) strictly into build/site"
	@echo "make image REF=RELEASE:VARIANT   build one variant of the matrix (BUILD_FLAGS=... rlbox build options; CI uses it)"
	@echo "make image-a2           build $(FLAGSHIP):a2-arm (BUILD_FLAGS=...)"
	@echo "make image-a3           build $(FLAGSHIP):a3-arm (BUILD_FLAGS=...)"
	@echo "make image-ax           build $(FLAGSHIP):ax-x86 (BUILD_FLAGS=...)"
	@echo "make sim-image          the local Debian base + the simulation image rlbox_sim (make rehearsal uses it)"
	@echo "make rehearse-image REF=RELEASE:VARIANT [MIRRORS=DIR]   real-content build on a CANN stand-in base + checks"
	@echo "make bench              benchmarks under bench/ at full size (image rebuild, start-up, bring-up, pre-flight, node loss, log follow)"
	@echo "make bench-quick        every bench/*.py --quick: smallest size, one repetition (tests/test_bench_quick.py in CI)"

setup:
	bash .ci/provision

test: setup
	$(PYTHON) -m pytest -q

sim-image: setup
	bash tools/make-base-image.sh
	$(RLBOX) build rlbox_sim:$(SIM_VARIANT) $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

# A real-content rehearsal of one variant (rlbox rehearse): MIRRORS=DIR fills the source cache's git
# sources from local full clones first (DIR/<owner>+<name>/repo), for machines without GitHub.
MIRRORS ?=
rehearse-image: setup
	@if [ -z "$(REF)" ]; then echo "make rehearse-image: give REF=RELEASE:VARIANT (see rlbox images list)" >&2; exit 2; fi
	$(if $(MIRRORS),$(VENV) bash tools/sources-from-mirrors.sh $(MIRRORS))
	$(RLBOX) rehearse $(REF) $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

rehearsal: sim-image
	$(RLBOX) run --sim --nodes 4 --hardware a3 --smoke-test

lint: check-dockerfiles
	$(VENV) hadolint dockerfiles/*/*/Dockerfile

dockerfiles: setup
	$(RLBOX) render

check-dockerfiles: setup
	$(RLBOX) render --check
	$(RLBOX) lock --check

# One variant of the matrix: what a developer and the CI workflow (.github/workflows/images.yml) run.
image: setup
	@if [ -z "$(REF)" ]; then echo "make image: give REF=RELEASE:VARIANT (see rlbox images list)" >&2; exit 2; fi
	$(RLBOX) build $(REF) $(BUILD_FLAGS)

image-a2:
	@$(MAKE) --no-print-directory image REF=$(FLAGSHIP):a2-arm

image-a3:
	@$(MAKE) --no-print-directory image REF=$(FLAGSHIP):a3-arm

image-ax:
	@$(MAKE) --no-print-directory image REF=$(FLAGSHIP):ax-x86

bench: sim-image
	$(PYTHON) bench/build_cache.py
	$(PYTHON) bench/startup.py
	$(PYTHON) bench/bringup.py
	$(PYTHON) bench/preflight.py
	$(PYTHON) bench/node_loss.py
	$(PYTHON) bench/log_follow.py

# Each bench at its smallest size, one repetition: proves it runs (CI: tests/test_bench_quick.py).
bench-quick: sim-image
	set -e; for b in bench/*.py; do echo "== $$b --quick"; $(PYTHON) $$b --quick; done

docs: setup
	$(VENV) export NO_MKDOCS_2_WARNING=1; "$(CURDIR)/.venv/bin/python" -m mkdocs build --strict --site-dir build/site
