#!/usr/bin/env bash
# Build llama-cpp-python[server] from the PyPI source release into its own venv,
# .venv-llama-cpp/, for the benchmarks' third peer (bench/agent_loop.py). A venv of its
# own keeps its FastAPI/uvicorn pins away from omlx's. Built once per variant: the wheel
# is kept in .venv-llama-cpp/wheels/<variant>/ and reused.
#
# Variant `cpu-avx2` (default): ggml's own CPU kernels, llama.cpp's fast path for quantized
# GGUF weights. Variant `openblas-avx2` (LLAMA_CPP_BLAS=1; Debian: libopenblas-dev): ggml's
# BLAS backend, which dequantizes the weights on every batch of 32+ tokens; measured here
# it made a 40-token follow-up ~5x slower than the CPU kernels (docs/benchmarks.md).
# The multimodal library (mtmd) is not built: the benches serve text only.
#
# Exits non-zero, saying why, where it cannot be built; the benchmarks then skip this
# peer with a note. Takes ~15 CPU-minutes (40 min wall on a busy 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."

SPEC=${LLAMA_CPP_SPEC:-"llama-cpp-python[server]>=0.3,<0.4"}
VENV=.venv-llama-cpp
PYTHON=${PYTHON:-python3}
# Built for AVX2, not for the build machine's own features: on this project's x86 machines
# (Xeon with AVX-512 and AMX, in a VM) llama-cpp-python 0.3.36 built natively crashed
# (SIGSEGV in llama_decode) on any batch of more than one token, with its AMX kernels and
# without them. Variant names carry the flags, so an older build is not reused.
VARIANT=cpu-avx2
FLAGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
if [ "${LLAMA_CPP_BLAS:-0}" = 1 ]; then
  VARIANT=openblas-avx2
  FLAGS="$FLAGS -DGGML_BLAS=ON -DGGML_BLAS_VENDOR=OpenBLAS"
fi

if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/variant" 2>/dev/null)" = "$VARIANT" ] \
  && "$VENV/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
  echo "llama-cpp-python $("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)') ($VARIANT) already in $VENV"
  exit 0
fi
for tool in cmake gcc g++; do
  command -v "$tool" >/dev/null || { echo "cannot build llama-cpp-python: $tool not found" >&2; exit 1; }
done
if [ "$VARIANT" = openblas-avx2 ] && [ ! -e /usr/include/x86_64-linux-gnu/cblas.h ] && [ ! -e /usr/include/cblas.h ]; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev >/dev/null 2>&1 \
    || { echo "cannot build the openblas variant: no OpenBLAS headers (libopenblas-dev)" >&2; exit 1; }
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
wheels="$VENV/wheels/$VARIANT"
mkdir -p "$wheels"
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "building $SPEC, variant $VARIANT (CMAKE_ARGS=$FLAGS ${CMAKE_ARGS:-})"
  CMAKE_ARGS="$FLAGS ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    "$VENV/bin/python" -m pip wheel --no-deps --no-cache-dir -w "$wheels" "$SPEC"
fi
wheel=$(ls "$wheels"/llama_cpp_python-*.whl | tail -1)
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
"$VENV/bin/python" -m pip install -q "$wheel[server]"
echo "$VARIANT" > "$VENV/variant"
"$VENV/bin/python" -c "import llama_cpp.server, llama_cpp; print('llama-cpp-python', llama_cpp.__version__, '($VARIANT) in $VENV')"
