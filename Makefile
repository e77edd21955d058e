# rlbox developer and CI entry points. `make help` lists them.
# The Python to use, decided when a recipe runs (after `setup`): .ci/provision makes .venv only
# where the machine's python3 may not be installed into (Debian's own, "externally managed").
VENV   = if [ -x .venv/bin/python ]; then export PATH="$(CURDIR)/.venv/bin:$$PATH"; fi;
PYTHON = $(VENV) py=python3; [ ! -x .venv/bin/python ] || py=.venv/bin/python; "$$py"
RLBOX  = $(PYTHON) -m rlbox.cli
FLAGSHIP ?= verl_pt27_25rc3
BUILD_FLAGS ?=

SIM_VARIANT := $(shell uname -m | sed -e 's/x86_64/amd64/' -e 's/aarch64/arm64/')
CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)

.PHONY: help setup test lint dockerfiles check-dockerfiles image-a2 image-a3 image-ax images bench rehearsal sim-image

help:
	@echo "make rehearsal     4-node simulated Atlas A3 cluster: 64 NPUs in Ray, smoke-test job, teardown"
	@echo "make test          the whole test suite (engine tests included)"
	@echo "make setup         provision Docker engine + buildx + sshd, install rlbox (both above run it)"
	@echo "make lint          hadolint over every rendered Dockerfile + render --check"
	@echo "make dockerfiles   re-render dockerfiles/ from images/, templates/, patches/"
	@echo "make image-a2|image-a3|image-ax   build $(FLAGSHIP) for that hardware (BUILD_FLAGS=...)"
	@echo "make bench         benchmarks under bench/ (image rebuild, cluster bring-up, pre-flight)"

setup:
	bash .ci/provision

test: setup
	$(PYTHON) -m pytest -q

sim-image: setup
	bash tools/make-base-image.sh
	$(RLBOX) build rlbox_sim:$(SIM_VARIANT) $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

rehearsal: sim-image
	$(RLBOX) run --sim --nodes 4 --hardware a3 --smoke-test

lint: check-dockerfiles
	$(VENV) hadolint dockerfiles/*/*/Dockerfile

dockerfiles:
	$(RLBOX) render

check-dockerfiles:
	$(RLBOX) render --check

image-a2:
	$(RLBOX) build $(FLAGSHIP):a2-arm $(BUILD_FLAGS)

image-a3:
	$(RLBOX) build $(FLAGSHIP):a3-arm $(BUILD_FLAGS)

image-ax:
	$(RLBOX) build $(FLAGSHIP):ax-x86 $(BUILD_FLAGS)

bench: sim-image
	$(PYTHON) bench/build_cache.py
	$(PYTHON) bench/bringup.py
	$(PYTHON) bench/preflight.py
