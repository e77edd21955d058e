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

.PHONY: help setup test lint dockerfiles check-dockerfiles image image-a2 image-a3 image-ax bench rehearsal sim-image rehearse-image arm64-emulation

help:
	@echo "make rehearsal     4-node simulated Atlas A3 cluster: 64 NPUs in Ray, smoke-test job, teardown"
	@echo "make test          the whole test suite (engine tests included)"
	@echo "make setup         provision Docker engine + buildx + sshd, install rlbox into .venv (both above run it)"
	@echo "make lint          hadolint over every rendered Dockerfile + render --check + lock --check"
	@echo "make dockerfiles   re-render dockerfiles/ from images/, templates/, patches/"
	@echo "make image REF=RELEASE:VARIANT    build one variant of the matrix (BUILD_FLAGS=... rlbox build options; CI uses it)"
	@echo "make image-a2|image-a3|image-ax   build $(FLAGSHIP) for that hardware (BUILD_FLAGS=...)"
	@echo "make rehearse-image REF=RELEASE:VARIANT [MIRRORS=DIR]   real-content build on a CANN stand-in base + checks"
	@echo "make arm64-emulation   let this x86 machine build linux/arm64 (binfmt_misc, qemu-user-static, F flag); rehearse-image runs it for arm64"
	@echo "make bench         benchmarks under bench/ (image rebuild, cluster bring-up, pre-flight, node loss, log follow)"

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
# linux/arm64 builds on an x86_64 machine run under QEMU: binfmt_misc mounted, qemu-user-static and
# binfmt-support installed, qemu-aarch64 registered with the F flag (BuildKit needs it). Idempotent; one
# line saying why not where it cannot. Not part of `setup`: CI builds no arm64 image.
arm64-emulation:
	@bash tools/enable-arm64-emulation.sh

# The platform of REF (linux/amd64, linux/arm64), read from the matrix.
REF_PLATFORM = $(RLBOX) images list --json | RLBOX_REF="$(REF)" "$(CURDIR)/.venv/bin/python" -c 'import json, os, sys; \
	print(next((r["platform"] for r in json.load(sys.stdin) if r["ref"] == os.environ["RLBOX_REF"]), ""))'

rehearse-image: setup
	@if [ -z "$(REF)" ]; then echo "make rehearse-image: give REF=RELEASE:VARIANT (see rlbox images list)" >&2; exit 2; fi
	@if [ "$$($(REF_PLATFORM))" = linux/arm64 ]; then $(MAKE) --no-print-directory arm64-emulation; fi
	$(if $(MIRRORS),$(VENV) bash tools/sources-from-mirrors.sh $(MIRRORS))
	$(RLBOX) rehearse $(REF) $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

rehearsal: sim-image
	$(RLBOX) run --sim --nodes 4 --hardware a3 --smoke-test

lint: check-dockerfiles
	$(VENV) hadolint dockerfiles/*/*/Dockerfile

dockerfiles:
	$(RLBOX) render

check-dockerfiles:
	$(RLBOX) render --check
	$(RLBOX) lock --check

# One variant of the matrix: what a developer and the CI workflow (.github/workflows/images.yml) run.
image:
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
	$(PYTHON) bench/bringup.py
	$(PYTHON) bench/preflight.py
	$(PYTHON) bench/node_loss.py
	$(PYTHON) bench/log_follow.py
