# Optional layer for multi-node jobs on A3 Ultra (a3-ultragpu-8g) and A4 (a4-highgpu-8g): Google's
# NCCL gIB network plugin (GPUDirect RDMA over RoCE) on top of the project's training image.
# Not one of the tagged images (components/images.py): it adds system packages only, no project code.
# Source: Google Cloud AI Hypercomputer, "NCCL/gIB release notes (x86)", v1.1.2 of 2026-05-14: apt
# repository https://packages.cloud.google.com/apt gpudirect-gib-apt, packages nccl-gib and
# nccl-gib-plugins (Ubuntu 22.04, built with CUDA 13.0, as the dependency image).
# Not built or run here (no Docker, no A3 Ultra / A4): preflight's NCCL line says whether it took hold.
# Build:  docker build -f images/gib-layer.Dockerfile --build-arg TRAIN_IMAGE=REGISTRY/train:TAG \
#           -t REGISTRY/train:TAG-gib .
# Use:    images.train: REGISTRY/train:TAG-gib and environment: {NCCL_NET: gIB} (docs/vertex.md, GPUDirect).
ARG TRAIN_IMAGE=""
FROM ${TRAIN_IMAGE}
ARG GIB_VERSION=1.1.2
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gnupg \
 && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
 && echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt gpudirect-gib-apt main" \
      > /etc/apt/sources.list.d/gpudirect-gib.list \
 && apt-get update \
 && apt-get install -y --no-install-recommends "nccl-gib=${GIB_VERSION}" "nccl-gib-plugins=${GIB_VERSION}" \
 && rm -rf /var/lib/apt/lists/* \
 && dpkg -L nccl-gib-plugins | grep -E 'libnccl-net[^/]*\.so' \
 && dpkg -L nccl-gib-plugins | grep -E 'libnccl-net[^/]*\.so' | head -1 | xargs dirname > /etc/gib-lib-dir
# NCCL finds the plugin (libnccl-net*.so) through the library path; the directory is the package's own
# (read from dpkg above, /usr/local/gib/lib64 in Google's guides; the build stops if it is not there).
ENV LD_LIBRARY_PATH=/usr/local/gib/lib64:${LD_LIBRARY_PATH}
RUN test "$(cat /etc/gib-lib-dir)" = /usr/local/gib/lib64
