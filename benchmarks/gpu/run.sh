#!/usr/bin/env bash
# The GPU check, one command (docs/performance.md): install lmpo from this tree without network, run the GPU
# test subset (`pytest -m gpu`), then benchmarks/gpu/bench.py; writes gpu.json, gpu.md and the two logs into
# OUT_DIR (default: $OUT where set, else runs/gpu).
#
#   bash benchmarks/gpu/run.sh              # on a CUDA machine (about 5 minutes on one H100)
#   bash benchmarks/gpu/run.sh --dry-run    # the same code on the CPU, shrunk (part of the default test suite)
#   bash benchmarks/gpu/run.sh --hf-lengths 512   # further arguments go to bench.py
#
# Offline install: wheels of what the machine lacks (trl, datasets, dill, multiprocess, platformdirs) are taken
# from .whl/ when that folder exists; lmpo itself is built from the tree (--no-index, --no-build-isolation).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-${OUT:-runs/gpu}}
DRY=""
BENCH_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=--dry-run ;;
    *) BENCH_ARGS+=("$arg") ;;  # passed to bench.py (e.g. --sections decode --hf-lengths 512)
  esac
done
mkdir -p "$OUT_DIR"

if [ -z "$DRY" ]; then
  SITE=${LMPO_SITE:-/tmp/lmpo-site}
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      || { echo "installing the carried wheels failed" >&2; exit 1; }
  fi
  if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$SITE" . \
      >"$OUT_DIR/install.log" 2>&1; then
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else  # no build backend on the machine: the tree's sources, as an editable install would give them
    echo "building lmpo failed (see install.log): using src/ on PYTHONPATH" >&2
    export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
  "$PY" -c "import lmpo, torch; print('lmpo from', lmpo.__file__, '| torch', torch.__version__, '|', torch.cuda.get_device_name())" \
    || exit 1
  PYTHONUNBUFFERED=1 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tee "$OUT_DIR/pytest.log"
  TESTS=${PIPESTATUS[0]}
else
  TESTS=0
fi

PYTHONUNBUFFERED=1 "$PY" benchmarks/gpu/bench.py $DRY --out "$OUT_DIR" "${BENCH_ARGS[@]}" 2>&1 | tee "$OUT_DIR/bench.log"
BENCH=${PIPESTATUS[0]}
echo "pytest -m gpu exit $TESTS, bench exit $BENCH; results in $OUT_DIR/gpu.md"
[ "$TESTS" = 0 ] && [ "$BENCH" = 0 ]
