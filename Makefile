# offloadctl: `make demo` runs the main job on a sample model, `make test` runs the linters and the tests.
# Both create .venv and install everything on first use.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The Ascend build of onnxruntime (it runs on CPU too). Use EXTRA=cpu or EXTRA=cuda without Ascend.
EXTRA  ?= cann
OUT    ?= build/demo
# the Python sources ruff checks and formats (mypy checks offloadctl/)
LINT   := offloadctl _offloadctl.py tests bench sample_models

.PHONY: install demo lint format test test-install test-genai test-device bench samples clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRA),test]"
	touch $@

install: $(BIN)/.installed

samples: install
	$(BIN)/python sample_models/make_samples.py sample_models

demo: install
	@mkdir -p $(OUT)
	$(BIN)/offloadctl inspect sample_models/unet.onnx --top 5
	$(BIN)/offloadctl plan sample_models/unet.onnx -o $(OUT)/unet.plan.json --select-distance 10 --prefetch-distance 3 --params \
	  --report $(OUT)/unet.plan.md
	$(BIN)/offloadctl apply $(OUT)/unet.plan.json -o $(OUT)/unet.offload.onnx
	$(BIN)/offloadctl run $(OUT)/unet.offload.onnx --device cpu --inputs sample_models/unet.inputs.npz \
	  --compare-to sample_models/unet.onnx
	$(BIN)/offloadctl simulate sample_models/unet.onnx --plan $(OUT)/unet.plan.json --plot $(OUT)/unet.memory.png
	$(BIN)/offloadctl plan sample_models/transformer.onnx -o $(OUT)/transformer.budget.json --budget 800KiB

# ruff (lint, format, complexity), mypy and the import layers (import-linter),
# at the versions pinned in the test extra
lint: install
	$(BIN)/ruff check $(LINT)
	$(BIN)/ruff format --check $(LINT)
	$(BIN)/mypy offloadctl
	$(BIN)/lint-imports --no-cache

# apply ruff's formatting and its safe fixes
format: install
	$(BIN)/ruff format $(LINT)
	$(BIN)/ruff check --fix $(LINT)

test: install lint
	$(BIN)/python -m pytest -q

# pip install '.[cpu]' into a fresh virtual environment and compare its figures with this install's.
test-install: install
	$(BIN)/python -m pytest -q -m install

# onnxruntime-genai generates tokens from a rewritten model folder and from its original; it needs the
# plain onnxruntime package, so it gets a virtual environment of its own (versions pinned here).
GENAI_VENV ?= .venv-genai
GENAI_PKGS := onnxruntime-genai==0.18.0 onnxruntime==1.32.0
$(GENAI_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(GENAI_VENV)
	$(GENAI_VENV)/bin/python -m pip install --quiet $(GENAI_PKGS)
	touch $@

test-genai: install $(GENAI_VENV)/.installed
	OFFLOADCTL_GENAI_PYTHON=$(GENAI_VENV)/bin/python $(BIN)/python -m pytest -q -m genai

# Every rewrite check on a real device provider: onnxruntime's WebGPU plugin, over Mesa's software Vulkan
# driver (lavapipe) when the machine has no GPU. Its own virtual environment (versions pinned here), and
# the driver unpacked into it by tests/webgpu/setup.sh (nothing is installed system-wide).
DEVICE_VENV ?= .venv-device
DEVICE_PKGS := onnxruntime==1.32.0 onnxruntime-ep-webgpu==0.4.0
$(DEVICE_VENV)/.installed: Makefile pyproject.toml tests/webgpu/setup.sh
	$(PYTHON) -m venv $(DEVICE_VENV)
	$(DEVICE_VENV)/bin/python -m pip install --quiet $(DEVICE_PKGS) -e .
	bash tests/webgpu/setup.sh $(DEVICE_VENV)/vulkan
	touch $@

test-device: install $(DEVICE_VENV)/.installed
	OFFLOADCTL_DEVICE_VENV=$(DEVICE_VENV) $(BIN)/python -m pytest -q -m device

bench: install
	@for script in bench/bench_*.py; do [ -e "$$script" ] || continue; echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf build .pytest_cache
