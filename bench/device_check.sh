#!/usr/bin/env bash
# The device check: offloadctl on a CUDA GPU, in one command of a few minutes.
#
#   1. installs onnxruntime-gpu (and any other wheel) from the folder $WHEELS (default: .whl beside
#      the repository root), with no index: a GPU machine that cannot reach a registry can run it;
#   2. CHECK=streams (the default): copies on a stream of their own (bench/streams_check.py), five
#      setups of a generated fp16 model whose copies take about as long as its compute, the race
#      check of the fences, and two rewrites on streams run by `offloadctl run --compare-to` in both
#      orders: a fused graph (--opt-level all for the device) and onnxruntime's in-place pattern;
#   3. CHECK=samples: for each sample, original and rewritten (a distance plan with weights, order pins
#      on), on CUDA: the measured CUDA arena peak (onnxruntime's allocator statistics, DEFAULT order) against the
#      simulated device peak in the same order, and the slowdown timed side by side (PRIORITY_BASED)
#      against the estimate under a profile measured there (offloadctl profile --device cuda).
#
# Usage, on the GPU machine, from the repository root:
#   WHEELS=.whl bash bench/device_check.sh            # wheels: onnxruntime-gpu and its CUDA/cuDNN needs
#   WHEELS=.whl CHECK=samples bash bench/device_check.sh
# A dry run here: python bench/streams_check.py --device cpu --small
# Fetch the wheels where pip works (Python and platform of the GPU machine), e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       -d .whl onnxruntime-gpu==1.24.4
# onnxruntime-gpu 1.24.4 is built for CUDA 12 and cuDNN 9: the machine needs those libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/offloadctl-site}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
case "${CHECK:-streams}" in
  streams) timeout 480 python3 bench/streams_check.py --device cuda "$@" ;;
  samples) timeout 480 python3 bench/device_check.py "$@" ;;
  *) echo "CHECK is streams or samples" >&2; exit 2 ;;
esac
