# rlbox developer and CI entry points. `make help` lists them.
PYTHON ?= python3
RLBOX  ?= $(PYTHON) -m rlbox.cli
FLAGSHIP ?= verl_pt27_25rc3
BUILD_FLAGS ?=

.PHONY: help setup test lint dockerfiles check-dockerfiles image-a2 image-a3 image-ax images bench

help:
	@echo "make setup         provision Docker engine + buildx, install rlbox with test extras"
	@echo "make test          the whole test suite (engine tests included)"
	@echo "make lint          hadolint over every rendered Dockerfile + render --check"
	@echo "make dockerfiles   re-render dockerfiles/ from images/, templates/, patches/"
	@echo "make image-a2|image-a3|image-ax   build $(FLAGSHIP) for that hardware (BUILD_FLAGS=...)"
	@echo "make bench         benchmarks under bench/ (cold build vs one-patch rebuild)"

setup:
	bash .ci/provision

test:
	$(PYTHON) -m pytest -q

lint: check-dockerfiles
	hadolint dockerfiles/*/*/Dockerfile

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

bench:
	$(PYTHON) bench/build_cache.py
