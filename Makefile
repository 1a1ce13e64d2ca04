# distbench: every target does whatever set-up is missing, and nothing more.
#   make demo    the DDP-vs-Horovod comparison
#   make test    the test suite (tests/unit, then tests/integration with real launchers), each behaviour once:
#                of each launcher matrix a covering design, the rest (marked full_matrix) left to test-all
#   make test-all   make test plus the rest of the matrices (every pair), in one run
#   make test-rest  only the rest (-m full_matrix): what test-all adds to test (CI runs test, then this)
#   make test-fast  the in-process unit tests (under a minute; those that start processes run in make test)
#   make lint    ruff and the import layering (lint-imports)
#   make image   the image distbench:cpu from this checkout (make image-cuda: distbench:cuda)
#   make test-docker  the image built and run for real (tests/docker, also in test-all; starts dockerd without a bridge)
#   make stress  the tests of signals, launchers and timeouts, STRESS_N times each in a row (default 10);
#                one failure in them is a race: fix it, never retry it
#   make notebook  results/compare.ipynb executed headless from here; the executed copy goes to NOTEBOOK_OUT, its
#                report beside it; RUNS=results/runs/<compare-id> reads that compare instead of the reference
#   make gpu-bundle  here: what a GPU machine without a registry needs (gpu-bundle/); make gpu-check there
# Override: make test TORCH_SPEC='torch==2.14.1'; make test VENV=/path/to/env TORCH_SPEC= (keep its torch);
#           make test PYTEST_ARGS='-k launch -x'; make stress STRESS_N=20 STRESS_TESTS=tests/integration/test_interrupts.py.

PYTHON3    ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
PY         := $(VENV)/bin/python
# The stamp's name carries TORCH_SPEC, so a different spec re-runs the install.
STAMP      := $(VENV)/.distbench-deps-$(shell echo '$(TORCH_SPEC)' | cksum | cut -d' ' -f1)

.PHONY: setup horovod demo test test-all test-rest test-fast stress lint clean image image-cuda test-docker

$(PY):
	$(PYTHON3) -m venv $(VENV)

# Python dependencies; redone when pyproject.toml or TORCH_SPEC changes.
$(STAMP): pyproject.toml | $(PY)
	docker/install-system-deps.sh
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	if [ -n '$(TORCH_SPEC)' ]; then $(PY) -m pip install --quiet '$(TORCH_SPEC)'; fi
	$(PY) -m pip install --quiet -e '.[dev,hf,deepspeed]'
	echo '$(TORCH_SPEC)' > $@

setup: $(STAMP) horovod

# Seconds when Horovod is installed or its wheel is cached; about 3-8 minutes to build otherwise.
horovod: $(STAMP)
	docker/install-horovod.sh $(PY)

demo: setup
	$(VENV)/bin/distbench compare

# Two tiers of one suite: `full_matrix` marks the pairs of a matrix (fault mode, signal or bad input ×
# launcher) beyond its covering design. pytest's summary says how many tests it left to test-all; a -m in
# PYTEST_ARGS replaces the tier's.
test: setup
	$(VENV)/bin/pytest tests/unit tests/integration tests/docker -m 'not full_matrix' $(PYTEST_ARGS)

test-all: setup
	docker/install-system-deps.sh docker
	$(VENV)/bin/pytest tests/unit tests/integration tests/docker $(PYTEST_ARGS)

test-rest: setup
	docker/install-system-deps.sh docker
	$(VENV)/bin/pytest tests/unit tests/integration tests/docker -m full_matrix $(PYTEST_ARGS)

# In-process tests only (tests/unit without those marked `processes`): run them after every change.
test-fast: setup
	$(VENV)/bin/pytest tests/unit -m 'not processes' $(PYTEST_ARGS)

# Each test STRESS_N times in a row (pytest-repeat's --count); the last line counts what passed and failed.
STRESS_N     ?= 10
STRESS_TESTS ?= tests/unit/test_guard.py tests/unit/test_jobs.py tests/integration/test_interrupts.py \
                tests/integration/test_reliability.py::test_fault_ends_the_job_and_leaves_whole_failed_results \
                tests/integration/test_reliability.py::test_a_killed_rank_is_not_blamed_on_rank_0 \
                tests/integration/test_reliability.py::test_compare_marks_a_run_whose_rank_0_was_killed

stress: setup
	$(VENV)/bin/pytest --count $(STRESS_N) $(STRESS_TESTS) $(PYTEST_ARGS)

# The image from this checkout (docker/Dockerfile; docs/install.md): it says what is missing (no engine, no
# daemon) in one line, and makes a Debian base (docker/make-base.sh) where the default cannot be pulled.
image:
	docker/build-image.sh distbench:cpu

# The image for real (tests/docker): a daemon without a bridge where none runs, the image built from this
# checkout, doctor, a compare as an unknown user into a mount, docker stop mid-compare; nothing left after.
test-docker: setup
	docker/install-system-deps.sh docker
	$(VENV)/bin/pytest tests/docker $(PYTEST_ARGS)

image-cuda:
	BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 docker/build-image.sh distbench:cuda \
	    --build-arg BUILD_BASE=nvidia/cuda:12.8.1-devel-ubuntu22.04 \
	    --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 --build-arg DS_ACCELERATOR=cuda

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# Outside the tree, so the committed notebook keeps no outputs.
NOTEBOOK_OUT ?= $(or $(TMPDIR),/tmp)/distbench-compare.ipynb
.PHONY: notebook

# RUNS=results/runs/<compare-id>: the notebook reads that compare instead of the committed reference.
RUNS ?=
notebook: $(STAMP)
	$(PY) results/execute_notebook.py $(NOTEBOOK_OUT) $(RUNS)

clean:
	rm -rf $(VENV) results/runs

# The GPU path (docs/gpu.md). gpu-bundle runs here; gpu-check runs on the GPU machine, from the repository
# root with gpu-bundle/ present, in that machine's own Python (about 8 minutes; exits 2 without CUDA).
GPU_PYTHON     ?= python3
GPU_CHECK_ARGS ?=
.PHONY: gpu-bundle gpu-check

gpu-bundle: $(STAMP)
	$(PY) docker/gpu_bundle.py gpu-bundle

gpu-check:
	@$(GPU_PYTHON) docker/gpu_check.py --bundle gpu-bundle $(GPU_CHECK_ARGS)
