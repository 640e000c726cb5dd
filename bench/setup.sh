#!/usr/bin/env bash
# Set up what `make bench` needs besides the project's own venv, all inside bench/ (gitignored):
#   bench/.venv-pa/       its own venv: tritonclient 2.51.0 (the last wheel that ships a perf_analyzer binary
#                         that starts on glibc 2.36) pins protobuf 4.x, which clashes with the project's pins
#   bench/.cache/libb64/  Debian's libb64-0d, unpacked (perf_analyzer links libb64.so.0d; no root install)
#   bench/.cache/perf_analyzer   a wrapper that sets LD_LIBRARY_PATH (libb64 + libcudart from PyPI's
#                         nvidia-cuda-runtime-cu12; perf_analyzer links libcudart.so.12 even on CPU) and runs it
#   bench/.venv-pytriton/ its own venv: nvidia-pytriton 0.7.0 (it bundles Triton server 2.51.0 and wants numpy
#                         1.x) with the project's onnxruntime, for the batching section's PyTriton server
#                         (bench/pytriton/serve.py)
#   --with-py-spy         also installs py-spy into bench/.venv-pa (for `bench/run.py --profile`)
# Idempotent: a second run only re-checks `perf_analyzer --version`.
set -euo pipefail

WITH_PY_SPY=0
for arg in "$@"; do
    case $arg in
        --with-py-spy) WITH_PY_SPY=1 ;;
        *) echo "usage: bench/setup.sh [--with-py-spy]" >&2; exit 2 ;;
    esac
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=$HERE/.venv-pa
CACHE=$HERE/.cache
TRITONCLIENT_VERSION=2.51.0
CUDART_VERSION=12.9.79
PY_SPY_VERSION=0.4.3
LIBB64_PACKAGE=libb64-0d
WRAPPER=$CACHE/perf_analyzer
STAMP=$VENV/.installed-$TRITONCLIENT_VERSION-$CUDART_VERSION

mkdir -p "$CACHE"

if [[ ! -f $STAMP ]]; then
    echo "bench/setup.sh: creating $VENV (tritonclient[grpc]==$TRITONCLIENT_VERSION, nvidia-cuda-runtime-cu12==$CUDART_VERSION)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "tritonclient[grpc]==$TRITONCLIENT_VERSION" "nvidia-cuda-runtime-cu12==$CUDART_VERSION"
    touch "$STAMP"
fi

if [[ $WITH_PY_SPY == 1 && ! -x $VENV/bin/py-spy ]]; then
    echo "bench/setup.sh: installing py-spy==$PY_SPY_VERSION into $VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "py-spy==$PY_SPY_VERSION"
fi

PYTRITON_VENV=$HERE/.venv-pytriton
PYTRITON_VERSION=0.7.0
ONNXRUNTIME_VERSION=$(sed -nE 's/^onnxruntime==(.*)$/\1/p' "$HERE/../requirements.txt")
PYTRITON_STAMP=$PYTRITON_VENV/.installed-$PYTRITON_VERSION-$ONNXRUNTIME_VERSION
if [[ ! -f $PYTRITON_STAMP ]]; then
    echo "bench/setup.sh: creating $PYTRITON_VENV (nvidia-pytriton==$PYTRITON_VERSION, onnxruntime==$ONNXRUNTIME_VERSION)"
    rm -rf "$PYTRITON_VENV"
    "$PYTHON" -m venv "$PYTRITON_VENV"
    "$PYTRITON_VENV/bin/pip" install --quiet --disable-pip-version-check \
        "nvidia-pytriton==$PYTRITON_VERSION" "onnxruntime==$ONNXRUNTIME_VERSION" "numpy==1.26.4"
    touch "$PYTRITON_STAMP"
fi

PA_BIN=$VENV/bin/perf_analyzer
if [[ ! -x $PA_BIN ]]; then
    echo "bench/setup.sh: $PA_BIN is missing (the tritonclient $TRITONCLIENT_VERSION wheel should ship it)" >&2
    exit 1
fi
CUDART_DIR=$("$VENV/bin/python" -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib"))')

LIBB64_DIR=$CACHE/libb64
if ! compgen -G "$LIBB64_DIR/usr/lib/*/libb64.so.0d" >/dev/null; then
    echo "bench/setup.sh: unpacking Debian's $LIBB64_PACKAGE into $LIBB64_DIR"
    DOWNLOAD=$(mktemp -d "$CACHE/.download.XXXXXX")
    trap 'rm -rf "$DOWNLOAD"' EXIT
    if ! (cd "$DOWNLOAD" && apt-get download "$LIBB64_PACKAGE" >/dev/null 2>&1); then
        echo "bench/setup.sh: 'apt-get download $LIBB64_PACKAGE' failed; retrying after 'apt-get update'" >&2
        apt-get update >/dev/null
        (cd "$DOWNLOAD" && apt-get download "$LIBB64_PACKAGE" >/dev/null)
    fi
    rm -rf "$LIBB64_DIR.new"
    dpkg-deb -x "$DOWNLOAD"/"$LIBB64_PACKAGE"_*.deb "$LIBB64_DIR.new"
    rm -rf "$LIBB64_DIR"
    mv "$LIBB64_DIR.new" "$LIBB64_DIR"
fi
LIBB64_LIB=$(dirname "$(compgen -G "$LIBB64_DIR/usr/lib/*/libb64.so.0d" | head -1)")

cat > "$WRAPPER.new" <<EOF
#!/usr/bin/env bash
# Written by bench/setup.sh: runs the perf_analyzer of tritonclient $TRITONCLIENT_VERSION with its libraries.
export LD_LIBRARY_PATH="$LIBB64_LIB:$CUDART_DIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$PA_BIN" "\$@"
EOF
chmod +x "$WRAPPER.new"
mv "$WRAPPER.new" "$WRAPPER"

if ! VERSION=$("$WRAPPER" --version 2>&1); then
    echo "bench/setup.sh: perf_analyzer does not start:" >&2
    echo "$VERSION" >&2
    exit 1
fi
echo "bench/setup.sh: ok: $(echo "$VERSION" | head -1) ($WRAPPER)"
