#!/usr/bin/env bash
# The wheels the GPU benchmarks carry to a GPU machine whose image has the lock's torch stack
# (torch 2.11.0, torchvision 0.26.0, Triton 3.6.0: benchmarks/gpu_stack.json) but its own
# transformers and no ms-swift or Unsloth (the device image: Python 3.12, x86-64). The swift
# wheels take their versions from requirements.lock, so a GPU run uses the lock's packages above torch.
#
#   bash benchmarks/gpu_wheels.sh swift     # .whl/ (~31 MB): ms-swift and its needs, peft, liger-kernel;
#                                           # .whl_hf/ (~17 MB): transformers, accelerate, huggingface_hub,
#                                           #   tokenizers, safetensors
#   bash benchmarks/gpu_wheels.sh unsloth   # .whl_u1/ (~60 MB) and .whl_u2/ (~29 MB): Unsloth 2026.10.9
#
# Run it here (where PyPI is reachable), in the repository root; the folders must be ignored
# by git (.gitignore or .git/info/exclude) and are named in the GPU call's `carry`. One call carries
# at most 64 MiB with the working tree (~3 MB): a swift run carries [".whl", ".whl_hf"] (~48 MB).
# On the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl .whl_hf/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
# Unsloth travels in calls of its own while the machine stays warm:
#   call 1, carry [".whl_u1"]:        pip install --no-index --no-deps --target /tmp/usite .whl_u1/*.whl
#   call 2, carry [".whl", ".whl_u2"]: the same for .whl_u2 into /tmp/usite and .whl into /tmp/site,
#                                      then PYTHONPATH=/tmp/usite:/tmp/site:$PWD (benchmarks/unsloth_peer.py)
#   (the lock's transformers under Unsloth too: a third call carries [".whl_hf"] into /tmp/site)
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

locked() {  # locked NAME...: each as NAME==VERSION from requirements.lock; a name the lock lacks stops the script
    python3 -c '
import re, sys
canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()
try:
    lines = open("requirements.lock").read().splitlines()
except FileNotFoundError:
    sys.exit("error: no requirements.lock here; run this in the repository root")
pins = {canon(n): f"{n}=={v}" for n, _, v in (line.strip().partition("==") for line in lines) if v}
missing = [name for name in sys.argv[1:] if canon(name) not in pins]
if missing:
    sys.exit("error: not in requirements.lock: " + " ".join(missing))
print(" ".join(pins[canon(name)] for name in sys.argv[1:]))
' "$@"
}

ignored_or_die() {  # the folder must not travel as tracked files or be committed ("$1/": a folder, existing or not)
    if ! git check-ignore -q "$1/"; then
        echo "error: $1 is not ignored by git; add '/$1/' to .git/info/exclude first" >&2
        exit 2
    fi
}

swift() {
    ignored_or_die .whl
    ignored_or_die .whl_hf
    local swift_pins hf_pins built_pins
    swift_pins=$(locked ms_swift datasets trl modelscope modelscope-hub cryptography cffi pycparser qwen-vl-utils \
        liger-kernel peft fsspec pydantic pydantic_core annotated-types typing-inspection openai jiter distro \
        sniffio fastapi starlette uvicorn zstandard nltk dill multiprocess binpacking json_repair addict dacite \
        rouge cpm-kernels attrdict lazy-importer hjson imagehash PyWavelets)
    hf_pins=$(locked transformers accelerate huggingface_hub tokenizers safetensors)
    built_pins=$(locked transformers-stream-generator deepspeed)
    # each *_pins holds several pins, one word each: split on purpose
    # shellcheck disable=SC2086
    download .whl $swift_pins
    # shellcheck disable=SC2086
    download .whl_hf $hf_pins
    # no wheel on PyPI: built here (pure Python)
    # shellcheck disable=SC2086
    DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w .whl $built_pins
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
for dir in .whl .whl_hf .whl_u1 .whl_u2; do
    [ -d "$dir" ] && echo "$dir: $(ls "$dir" | wc -l) wheels, $(du -sm "$dir" | cut -f1) MB"
done
exit 0
