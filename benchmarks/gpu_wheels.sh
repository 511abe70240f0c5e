#!/usr/bin/env bash
# The wheels the GPU benchmarks carry to a GPU machine that has torch, transformers and
# accelerate but not ms-swift or Unsloth (the device image: Python 3.12, x86-64).
#
#   bash benchmarks/gpu_wheels.sh swift     # .whl/: ms-swift 4.6.0 and its needs (~31 MB)
#   bash benchmarks/gpu_wheels.sh unsloth   # .whl_u1/ (~60 MB) and .whl_u2/ (~29 MB): Unsloth 2026.10.9
#
# Run it here (where PyPI is reachable), in the repository root; the folders must be ignored
# by git (.git/info/exclude) and are named in the GPU call's `carry`. One call carries at most
# 64 MiB with the working tree, so Unsloth travels in two calls while the machine stays warm:
#   call 1, carry [".whl_u1"]:        pip install --no-index --no-deps --target /tmp/usite .whl_u1/*.whl
#   call 2, carry [".whl", ".whl_u2"]: the same for .whl_u2 into /tmp/usite and .whl into /tmp/site,
#                                      then PYTHONPATH=/tmp/usite:/tmp/site:$PWD (benchmarks/unsloth_peer.py)
# On the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
set -euo pipefail

PLATFORMS=(
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
    --platform manylinux1_x86_64 --platform any
)

download() {  # download DIR NAME==VERSION...
    local dir=$1
    shift
    mkdir -p "$dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d "$dir" "$@"
}

ignored_or_die() {  # the folder must not travel as tracked files or be committed ("$1/": a folder, existing or not)
    if ! git check-ignore -q "$1/"; then
        echo "error: $1 is not ignored by git; add '/$1/' to .git/info/exclude first" >&2
        exit 2
    fi
}

swift() {
    ignored_or_die .whl
    download .whl ms_swift==4.6.0 datasets==4.8.4 trl==0.29.1 modelscope==1.40.2 modelscope-hub==0.5.1 \
        cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 qwen-vl-utils==0.0.14 liger-kernel==0.8.5 peft==0.20.0 \
        fsspec==2026.2.0 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
        openai==3.54.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 fastapi==0.165.0 starlette==1.10.0 \
        uvicorn==0.54.0 zstandard==0.25.0 nltk==3.10.4 dill==0.4.1 multiprocess==0.70.19 binpacking==2.0.1 \
        json_repair==0.64.5 addict==2.4.0 dacite==1.9.2 rouge==1.0.1 cpm-kernels==1.0.11 attrdict==2.0.1 \
        lazy-importer==0.1.0 hjson==3.1.0
    # no wheel on PyPI: built here (pure Python)
    python3 -m pip wheel -q --no-deps -w .whl transformers-stream-generator==0.0.5
    DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w .whl deepspeed==0.19.8
}

unsloth() {
    ignored_or_die .whl_u1
    ignored_or_die .whl_u2
    # what Unsloth and unsloth_zoo need beyond the device image and .whl (trl, datasets, peft come from .whl)
    download .whl_u1 unsloth_zoo==2026.10.9 bitsandbytes==0.50.2 torchao==0.18.0 diffusers==0.42.1 \
        hf_transfer==0.1.9 cut_cross_entropy==25.1.1 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 \
        shtab==1.13.0 json5==0.17.3 structlog==26.1.0 nest-asyncio==1.6.0 msgspec==0.22.0
    download .whl_u2 unsloth==2026.10.9
}

case "${1:-}" in
    swift) swift ;;
    unsloth) unsloth ;;
    *)
        echo "usage: bash benchmarks/gpu_wheels.sh swift|unsloth" >&2
        exit 2
        ;;
esac
for dir in .whl .whl_u1 .whl_u2; do
    [ -d "$dir" ] && echo "$dir: $(ls "$dir" | wc -l) wheels, $(du -sm "$dir" | cut -f1) MB"
done
exit 0
