#!/usr/bin/env bash
# Issue 11's benchmarks on a lent machine's CPU (the device tool's machines: no network, no model
# packages, 64 MiB a transfer). Two steps:
#
#   here:   make .venv/llama-cpp-avx512 && bash benchmarks/lent_cpu.sh prepare
#   there:  bash benchmarks/lent_cpu.sh run        (the device tool, carry [".devcarry"])
#
# `prepare` fills .devcarry/ (ignored by git, ~20 MB): the kernels built here (a ctypes library:
# any Python there loads it), the wheels that machine's Python lacked last time (gguf, llguidance,
# and llama-cpp-python's diskcache), llama-cpp-python built here for AVX-512 + VNNI + BF16
# without AMX (the AMX build died with SIGILL at its first evaluation on the Xeon lent on
# 2026-11-27), cut to the libraries an import and a load need, and SmolLM2's tokenizer alone as
# a GGUF. `run` writes random-weight files of the bundled shapes there (make_shaped_model.py,
# quantized by llama.cpp), then runs bench_generate.py (every x86 path of Ember beside llama.cpp)
# and bench_parallel.py on two cores of two different physical cores (taskset), within BUDGET
# seconds (default 420). Its libstdc++ must be the compiler's (LD_PRELOAD): the Python there
# loaded an older one first, and llama.cpp's std::regex crashed in it.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=$PWD/.devcarry

prepare() {
    set -e
    local py=.venv/bin/python lib=.venv/llama-cpp-avx512/llama_cpp
    [ -d $lib ] || { echo "first: make .venv/llama-cpp-avx512" >&2; exit 1; }
    rm -rf "$CARRY" && mkdir -p "$CARRY/wh" "$CARRY/llama-avx512/llama_cpp/lib"
    cp ember/backend/native/_ember_kernels.cpython-311-x86_64-linux-gnu.so "$CARRY/_ember_kernels.so"
    $py -m pip download -q --no-deps --dest "$CARRY/wh" gguf==0.19.0 diskcache llguidance \
        --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.12
    cp $lib/*.py "$CARRY/llama-avx512/llama_cpp/"
    for f in libllama.so libggml.so libggml.so.0 libggml-base.so.0 libggml-cpu.so.0; do
        cp $lib/lib/$f "$CARRY/llama-avx512/llama_cpp/lib/"
    done
    (cd benchmarks && ../$py -c "
import gguf, make_scale_model as scale
writer = gguf.GGUFWriter('$CARRY/smol-tok.gguf', 'llama')
scale.add_tokenizer(writer, None, 49152)
writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file()
writer.close()")
    du -sh "$CARRY"
}

run() {
    local start cpus
    start=$(date +%s)
    left() { echo $((${BUDGET:-420} - ($(date +%s) - start))); }
    step() { echo; echo "=== $* (t=$(($(date +%s) - start)) s)"; }
    step setup
    grep -m1 'model name' /proc/cpuinfo; grep -m1 'cpu family' /proc/cpuinfo
    grep -m1 '^model' /proc/cpuinfo; nproc; python3 --version
    grep -o 'avx512[a-z_0-9]*\|avx_vnni\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    python3 -m pip install -q --no-index --no-deps --find-links "$CARRY/wh" --target /tmp/deps \
        gguf llguidance diskcache
    LD_PRELOAD=$(gcc -print-file-name=libstdc++.so.6)
    export LD_PRELOAD PYTHONPATH=/tmp/deps:$CARRY/llama-avx512:$PWD
    cp "$CARRY/_ember_kernels.so" ember/backend/native/_ember_kernels.cpython-311-x86_64-linux-gnu.so
    cpus=0,1  # two physical cores, not two threads of one
    [ "$(cat /sys/devices/system/cpu/cpu1/topology/core_id)" = \
      "$(cat /sys/devices/system/cpu/cpu0/topology/core_id)" ] && cpus=0,2
    echo "cpus $cpus"
    python3 -c "from ember.backend import native; print(native.system_info())"

    step files
    python3 benchmarks/make_shaped_model.py smollm2 /tmp/smol.gguf --tokenizer "$CARRY/smol-tok.gguf" 2>&1 | tail -1
    python3 benchmarks/make_shaped_model.py llama3b /tmp/l3b8.gguf --layers 8 \
        --tokenizer "$CARRY/smol-tok.gguf" 2>&1 | tail -1

    step bench_generate, SmolLM2-shaped
    timeout 150 taskset -c $cpus python3 benchmarks/bench_generate.py --model /tmp/smol.gguf \
        --runs 3 --isa avx512 avxvnni avx2 | tail -6
    step bench_parallel, SmolLM2-shaped
    timeout 90 taskset -c $cpus python3 benchmarks/bench_parallel.py --model /tmp/smol.gguf \
        --runs 2 --parallel 1 8 --gen-tokens 64 | tail -3
    [ "$(left)" -gt 100 ] || return 0
    step bench_generate, 3B-shaped with 8 of its 28 layers
    timeout $(($(left) - 10)) taskset -c $cpus python3 benchmarks/bench_generate.py \
        --model /tmp/l3b8.gguf --runs 1 --gen-tokens 64 --isa avx512 avxvnni avx2 | tail -6
}

case "${1:-}" in
prepare) prepare ;;
run) run 2>&1 | tee -a "${OUT:-/tmp}/lent_cpu.txt" ;;
*) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
