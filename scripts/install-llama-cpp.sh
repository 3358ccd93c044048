#!/usr/bin/env bash
# Build llama-cpp-python[server] from the PyPI source release into its own venv,
# .venv-llama-cpp/, for the benchmarks' third peer (bench/agent_loop.py). A venv of its
# own keeps its FastAPI/uvicorn pins away from omlx's. Built once: the wheel is kept in
# .venv-llama-cpp/wheels/ and reused. With OpenBLAS headers (Debian: libopenblas-dev)
# ggml is built against OpenBLAS, as omlx and mlx_lm.server use it; without them, with
# ggml's own CPU kernels. Exits non-zero, saying why, where it cannot be built; the
# benchmarks then skip this peer with a note.
set -euo pipefail
cd "$(dirname "$0")/.."

SPEC=${LLAMA_CPP_SPEC:-"llama-cpp-python[server]>=0.3,<0.4"}
VENV=.venv-llama-cpp
PYTHON=${PYTHON:-python3}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
  echo "llama-cpp-python $("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)') already in $VENV"
  exit 0
fi
for tool in cmake gcc g++; do
  command -v "$tool" >/dev/null || { echo "cannot build llama-cpp-python: $tool not found" >&2; exit 1; }
done

# OpenBLAS headers, where the OS package manager allows it (setup.sh installs the library).
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi; }
if [ ! -e /usr/include/x86_64-linux-gnu/cblas.h ] && [ ! -e /usr/include/cblas.h ] && command -v apt-get >/dev/null; then
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev >/dev/null 2>&1 \
    || echo "note: could not install libopenblas-dev; building with ggml's own CPU kernels" >&2
fi
if [ -z "${CMAKE_ARGS:-}" ] && { [ -e /usr/include/x86_64-linux-gnu/cblas.h ] || [ -e /usr/include/cblas.h ]; }; then
  export CMAKE_ARGS="-DGGML_BLAS=ON -DGGML_BLAS_VENDOR=OpenBLAS"
fi
echo "building $SPEC (CMAKE_ARGS=${CMAKE_ARGS:-none}); a few minutes on 2 cores"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
mkdir -p "$VENV/wheels"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
if ! ls "$VENV"/wheels/llama_cpp_python-*.whl >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip wheel --no-deps --no-cache-dir -w "$VENV/wheels" "$SPEC"
fi
wheel=$(ls "$VENV"/wheels/llama_cpp_python-*.whl | tail -1)
"$VENV/bin/python" -m pip install -q "$wheel[server]"
"$VENV/bin/python" -c "import llama_cpp.server, llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'in $VENV')"
