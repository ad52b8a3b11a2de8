# Two commands do everything on a fresh machine:
#   make lab    install, prepare the data sets, start JupyterLab
#   make test   install, prepare the data sets, run every test and notebook
# Both are idempotent: a second run skips what is already done.

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Extras: CUDA libraries for TensorFlow where an NVIDIA driver is present.
EXTRAS ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu,)lab,dev
comma := ,
INSTALLED := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
LAB_PORT ?= 8888
LAB_IP ?= 127.0.0.1
# JupyterLab refuses to start as root unless told; containers and CI boxes often are root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
PYTEST_ARGS ?=
UV_VERSION := 0.13.9
# Test files run side by side (pytest-xdist, one file per worker: see conftest.py): most
# tests wait on process start-up and sockets, so 3 workers on 2 cores finish sooner.
TEST_JOBS ?= 3
# Python keeps each module compiled in __pycache__ beside it (git-ignored). Where the
# environment turns that off (PYTHONDONTWRITEBYTECODE), each process that inherits it
# compiles the kit's modules again and pytest rewrites every test file again. The kit's
# commands leave it on.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: lab test install system data horovod horovod-optional image lint clean-venv

install: system $(INSTALLED) data

system:
	@scripts/system-packages.sh

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# uv installs the kit and its dependencies into the venv: the same versions pip resolves,
# in about 24 s from its cache (~/.cache/uv) where pip took 60-70 s to unpack TensorFlow
# and the rest again for every clean clone. pip bootstraps it, pinned. --compile-bytecode
# as pip does: without it the first processes of the suite, started side by side, each
# compiled TensorFlow's modules again (and every process does where PYTHONDONTWRITEBYTECODE
# is set): the notebooks' kernels and workers took 180 CPU-s more.
$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "uv==$(UV_VERSION)" 2> >(grep -v "is ignored: it is neither" >&2)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e ".[$(EXTRAS)]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ddlkit)" >/dev/null
	rm -f $(VENV)/.installed-*
	touch $@

data: $(INSTALLED)
	$(BIN)/python -m ddlkit.data prepare

# Horovod 0.28.1 is built from its sdist against the venv's TensorFlow and the wheel is
# cached (scripts/build-horovod.sh; ~/.cache/ddlkit/wheels), so only the first run builds.
# `make test` needs it: CI must not pass without the Horovod tests, so a failed build
# fails the target. `make lab` goes on without it and says so (notebook 05 and the
# horovod strategy then explain the fix). It is built with Gloo and MPI (Debian's Open MPI,
# from system-packages.txt): the horovod strategy runs the ranks of one machine over MPI,
# through shared memory where Gloo goes through loopback TCP (notebooks 05 and 08 measure both).
# `make ... HOROVOD_MPI=` builds Gloo only.
HOROVOD_MPI ?= 1
HOROVOD_FLAGS := $(if $(HOROVOD_MPI),--mpi)

horovod: system $(INSTALLED)
	@scripts/build-horovod.sh $(HOROVOD_FLAGS) $(BIN)/python

horovod-optional: system $(INSTALLED)
	@scripts/build-horovod.sh --optional $(HOROVOD_FLAGS) $(BIN)/python

# The kit's container image (Containerfile), built with buildah from a Debian base the kit
# makes from Debian's packages, reusing this machine's caches (ddlkit/image/build.py).
image: install horovod
	$(BIN)/python -m ddlkit.image build

lab: install horovod-optional
	$(BIN)/jupyter lab --ip=$(LAB_IP) --port=$(LAB_PORT) --no-browser $(ALLOW_ROOT) \
		notebooks/00_start_here.ipynb

test: install horovod
	$(BIN)/ruff check ddlkit tests launch benchmarks
	# Notebook 00 first, alone: it saves the baseline every other notebook compares with.
	$(BIN)/python -m pytest notebooks/00_start_here.ipynb
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder \
		--ignore=notebooks/00_start_here.ipynb $(PYTEST_ARGS)

lint: $(INSTALLED)
	$(BIN)/ruff check ddlkit tests launch benchmarks
	$(BIN)/ruff format --check ddlkit tests launch benchmarks

clean-venv:
	rm -rf $(VENV)
