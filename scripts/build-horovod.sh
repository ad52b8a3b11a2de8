#!/usr/bin/env bash
# Build Horovod 0.28.1 (the last release) against this venv's TensorFlow, cache the
# wheel, and install it.
#
#   scripts/build-horovod.sh [--optional] [--mpi] [--cached-only] [--wheel-to DIR]
#                            [--tf-version V] [PYTHON]
#
# PYTHON is the venv's interpreter (default .venv/bin/python). Steps, each skipped
# when already done:
#   1. Horovod already installed for this key (a stamp in the venv): nothing to do.
#   2. A cached wheel for this key: install it (seconds).
#   3. Otherwise download the sdist (sha256-pinned), remove the one CMake line that
#      compiles xla_mpi_ops.cc (it includes XLA headers TF >= 2.16 no longer ships),
#      make horovodrun's "was Gloo/MPI built?" check ask the library instead of
#      importing TensorFlow (seconds less per launch), Horovod's Keras take its backend
#      from tf.keras instead of importing Keras 3 (which also lets its MetricAverageCallback
#      and LearningRateWarmupCallback run on tf-keras), and trace its gradient all-reduce
#      without AutoGraph (less CPU per rank) (scripts/patch_horovod.py; its docstring has
#      the measurements), build a wheel with Gloo and TensorFlow (and MPI with --mpi, the
#      Makefile's default), cache it, install it.
# The cache key is Horovod version + TensorFlow version + Python tag + machine + a digest
# of the code scripts/patch_horovod.py inserts, so a new TensorFlow, Python or patch builds
# again. Cache: $DDLKIT_HOME/wheels (default ~/.cache/ddlkit/wheels); the build log is
# kept there too.
#
# Exit code: 0 when Horovod is installed; non-zero when it could not be (the reason and
# the retry command are printed). With --optional a failure is reported the same way but
# exits 0, so `make lab` goes on without Horovod while `make test` fails loudly.
#
# --mpi also builds Horovod's MPI support (for `horovodrun --mpi`), against Debian's
# OpenMPI (apt-get install openmpi-bin libopenmpi-dev); its wheel has its own cache key.
# Gloo works either way. `make ... HOROVOD_MPI=1` passes it.
#
# --cached-only installs a cached wheel but never builds: it exits 3 when this key has none
# (the Containerfile installs compilers only then). --wheel-to DIR copies the wheel (cached
# or built) to DIR instead of installing it; --tf-version V names the TensorFlow it is for
# when PYTHON's environment has none (the Containerfile's first stage, looking for a cache).
set -euo pipefail

HOROVOD_VERSION=0.28.1
# sha256 of horovod-0.28.1.tar.gz as PyPI publishes it (checked against the index).
HOROVOD_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
XLA_LINE='list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")'

optional=0
mpi=0
cached_only=0
wheel_to=
tf_pin=
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --optional) optional=1 ;;
    --mpi) mpi=1 ;;
    --cached-only) cached_only=1 ;;
    --wheel-to) wheel_to=${2:?--wheel-to needs a directory}; shift ;;
    --tf-version) tf_pin=${2:?--tf-version needs a version}; shift ;;
    *) echo "build-horovod.sh: unknown option $1 (use --optional, --mpi, --cached-only," \
         "--wheel-to DIR, --tf-version V)" >&2; exit 2 ;;
  esac
  shift
done
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
retry="scripts/build-horovod.sh $PY"
[[ $mpi == 0 ]] || retry="scripts/build-horovod.sh --mpi $PY"

fail() {
  echo "" >&2
  echo "Horovod: NOT installed. $1" >&2
  [[ -n "${log:-}" && -s "${log:-}" ]] && {
    echo "--- last lines of $log ---" >&2
    tail -n 25 "$log" >&2
    echo "---" >&2
  }
  echo "Fix: ${2:-see the message above}, then retry with: $retry" >&2
  if [[ $optional == 1 ]]; then
    echo "Going on without Horovod: notebook 05_horovod and the horovod strategy will say" >&2
    echo "that Horovod is missing; everything else works." >&2
    exit 0
  fi
  exit 1
}

[[ -x "$PY" ]] || PY=$(command -v "$PY") || fail "no Python at $PY." "create the venv first (make install)"
if [[ -n "$tf_pin" ]]; then
  tf_version=$tf_pin
else
  tf_version=$("$PY" -c 'import importlib.metadata as m; print(m.version("tensorflow"))' \
    2>/dev/null) || fail "TensorFlow is not installed in $PY's environment." \
    "install the kit first (make install)"
fi
py_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if [[ $mpi == 1 ]]; then
  transports=gloo-mpi
  mpi_env=HOROVOD_WITH_MPI=1
else
  transports=gloo
  mpi_env=HOROVOD_WITHOUT_MPI=1
fi
horovod_patch=scripts/patch_horovod.py
[[ -f "$horovod_patch" ]] || fail "$horovod_patch is missing." "restore it from git"
patch_sum=$("$PY" "$horovod_patch" --digest) || fail "$horovod_patch --digest failed." "run it to see why"
key="horovod-${HOROVOD_VERSION}_tf-${tf_version}_${py_tag}_$(uname -m)_${transports}_p${patch_sum}"
cache="${DDLKIT_HOME:-$HOME/.cache/ddlkit}/wheels/$key"
venv=$(dirname "$(dirname "$PY")")
stamp="$venv/.horovod-$key"

if [[ -f "$stamp" ]] && "$PY" -c "import importlib.metadata as m, sys;
sys.exit(m.version('horovod') != '$HOROVOD_VERSION')" 2>/dev/null; then
  echo "Horovod $HOROVOD_VERSION: installed ($key)."
  exit 0
fi

mkdir -p "$cache"
log="$cache/build.log"
wheel=$(compgen -G "$cache/horovod-${HOROVOD_VERSION}-*.whl" | head -n 1 || true)
if [[ -z "$wheel" && $cached_only == 1 ]]; then
  echo "Horovod $HOROVOD_VERSION: no cached wheel for $key (--cached-only: not building)." >&2
  exit 3
fi
if [[ -z "$wheel" ]]; then
  for tool in cmake g++ make; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is not installed (needed to build)." \
      "run scripts/system-packages.sh (it installs cmake and g++ from system-packages.txt)"
  done
  if [[ $mpi == 1 ]] && ! command -v mpicxx >/dev/null 2>&1; then
    fail "--mpi needs MPI's compiler wrapper mpicxx, which is not installed." \
      "install OpenMPI (as root: apt-get install openmpi-bin libopenmpi-dev)"
  fi
  echo "Horovod $HOROVOD_VERSION: building a wheel against TensorFlow $tf_version" \
    "(a few minutes; log: $log)..."
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  : >"$log"
  "$PY" -m pip download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" \
    -d "$work" >>"$log" 2>&1 || fail "downloading the sdist from PyPI failed." \
    "check that PyPI is reachable (pip download horovod==$HOROVOD_VERSION)"
  sdist="$work/horovod-$HOROVOD_VERSION.tar.gz"
  got=$(sha256sum "$sdist" | cut -d' ' -f1)
  [[ "$got" == "$HOROVOD_SHA256" ]] || fail "the sdist's sha256 is $got, expected $HOROVOD_SHA256." \
    "do not use this file; check which package index pip uses (pip config list)"
  tar -xzf "$sdist" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  cmakelists="$src/horovod/tensorflow/CMakeLists.txt"
  grep -qxF "$XLA_LINE" "$cmakelists" || fail "the line to remove was not found in $cmakelists: $XLA_LINE" \
    "this script patches Horovod $HOROVOD_VERSION only; update the line in the script"
  grep -vxF "$XLA_LINE" "$cmakelists" >"$cmakelists.new"
  mv "$cmakelists.new" "$cmakelists"
  "$PY" "$horovod_patch" "$src" >>"$log" 2>&1 || fail "patching Horovod's sources failed." \
    "read $log; the patch is written for Horovod $HOROVOD_VERSION's sources"
  start=$(date +%s)
  # Horovod's setup.py runs make -j8 unless MAKEFLAGS is set: one job per core keeps
  # the compiler's memory in check on a small machine.
  if ! env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 "$mpi_env" \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" \
    "$PY" -m pip wheel -v --no-build-isolation --no-deps -w "$work/dist" "$src" >>"$log" 2>&1; then
    fail "the build failed (full log: $log)." \
      "read the log; a compiler error usually means a TensorFlow other than the kit's pin"
  fi
  built=$(compgen -G "$work/dist/horovod-${HOROVOD_VERSION}-*.whl" | head -n 1) ||
    fail "pip reported success but left no wheel in $work/dist." "read $log"
  cp "$built" "$cache/"
  wheel="$cache/$(basename "$built")"
  echo "Horovod: built in $(($(date +%s) - start)) s, cached as $wheel"
fi

if [[ -n "$wheel_to" ]]; then
  mkdir -p "$wheel_to" && cp "$wheel" "$wheel_to/"
  echo "Horovod $HOROVOD_VERSION: wheel copied to $wheel_to ($key)."
  exit 0
fi
echo "Horovod $HOROVOD_VERSION: installing $wheel"
"$PY" -m pip install -q --force-reinstall --no-deps "$wheel" >>"$log" 2>&1 &&
  "$PY" -m pip install -q "$wheel" >>"$log" 2>&1 ||
  fail "pip could not install the cached wheel $wheel." \
    "delete $cache to build it again"
# The library must load against this TensorFlow (catches an ABI mismatch now, not in a
# notebook): one process, Gloo, world size 1 (and MPI compiled in, with --mpi).
if ! HOROVOD_CONTROLLER=gloo HOROVOD_CPU_OPERATIONS=gloo "$PY" -c "import os
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
import horovod.tensorflow as hvd
hvd.init()
assert hvd.size() == 1 and hvd.gloo_built(), (hvd.size(), hvd.gloo_built())
assert hvd.mpi_built() == bool($mpi), ('mpi_built', hvd.mpi_built())
from horovod.common import util  # horovodrun's check answers from the library (the patch)
for c_function, built in (('horovod_gloo_built', True), ('horovod_mpi_built', bool($mpi))):
    got = util._library_flag('tensorflow', c_function, False)
    assert got is built, (c_function, got)" >>"$log" 2>&1 ||
  # Horovod's Keras on tf-keras's backend (the patch): Keras 3 is never imported.
  ! TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 "$PY" -c "import sys
import horovod.tensorflow.keras as hvd_keras
assert 'keras.src' not in sys.modules, 'Keras 3 was imported'
assert hvd_keras.callbacks.K.__name__.startswith('tf_keras.'), hvd_keras.callbacks.K" \
    >>"$log" 2>&1; then
  "$PY" -m pip uninstall -q -y horovod >/dev/null 2>&1 || true
  fail "the installed Horovod does not load with TensorFlow $tf_version (log: $log)." \
    "delete $cache to build it again"
fi
rm -f "$venv"/.horovod-*
touch "$stamp"
echo "Horovod $HOROVOD_VERSION: ready (horovodrun: $(dirname "$PY")/horovodrun)."
