# syntax=docker/dockerfile:1.7
#
# Two images from one file:
#   docker build --target operator -t holmes-operator:0.1.0 .
#   docker build --target trainer  -t holmes-trainer:0.1.0  .
#
# The chart (charts/holmes) runs the operator image with the same command as its ENTRYPOINT;
# the operator gives trainer pods the trainer image and a command on its PATH (python,
# torchrun). tests/unit/packaging/test_dockerfile.py checks both, and that every COPY source exists.

# Base images, pinned by tag (add @sha256 digests in a release pipeline that can resolve them).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# torch 2.13.0 wheels on PyPI are built against CUDA 13.0 and bring their own CUDA, cuDNN and
# NCCL libraries as pip packages; the CUDA "base" image adds what the NVIDIA container runtime
# expects (driver capability settings, cudart) without duplicating those libraries.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04

# PIP_CONFIG_FILE (optional build arg, declared in each stage that runs pip): a pip.conf for
# builds without PyPI. hack/build-images.sh points it at a wheelhouse mounted into the build
# (no-index + find-links); a plain `docker build` leaves it unset and pip uses PyPI.

# ---------------------------------------------------------------------------------------------
# wheel: the three distributions (pure Python), each from its own folder: holmes-train-contract
# (what both sides read), holmes-train-operator and holmes-train-trainer. Each image installs the
# contract and its own side only.
FROM ${PYTHON_IMAGE} AS wheel
ARG PIP_CONFIG_FILE
WORKDIR /src
COPY contract/ contract/
COPY operator/ operator/
COPY trainer/ trainer/
RUN pip install --no-cache-dir --disable-pip-version-check setuptools==84.2.1 \
 && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels ./contract ./operator ./trainer

# ---------------------------------------------------------------------------------------------
# operator-venv: the contract and the operator with their dependencies (no torch), at the versions
# the tests ran.
FROM ${PYTHON_IMAGE} AS operator-venv
ARG PIP_CONFIG_FILE
COPY docker/constraints.txt /tmp/constraints.txt
COPY --from=wheel /wheels/holmes_train_contract-*.whl /wheels/holmes_train_operator-*.whl /wheels/
RUN python -m venv /opt/holmes \
 && /opt/holmes/bin/pip install --no-cache-dir --disable-pip-version-check \
      -c /tmp/constraints.txt /wheels/*.whl \
 && /opt/holmes/bin/python -m compileall -q /opt/holmes/lib

# ---------------------------------------------------------------------------------------------
# operator-root: the operator image's whole file system (docker/rootfs.py): Python, its standard
# library, the venv, the openssl command (the metrics' self-signed certificate) and the shared
# libraries they load; no shell, no package manager. The operator's --help and openssl run
# inside it (chroot) fail the build when it misses a file.
FROM ${PYTHON_IMAGE} AS operator-root
COPY docker/rootfs.py /tmp/rootfs.py
COPY --from=operator-venv /opt/holmes /opt/holmes
RUN python /tmp/rootfs.py /opt/holmes /rootfs \
 && chroot --userspec=65532:65532 /rootfs /opt/holmes/bin/python -m holmes.operator --help >/dev/null \
 && chroot --userspec=65532:65532 /rootfs openssl version

# ---------------------------------------------------------------------------------------------
# operator: python -m holmes.operator (kopf). Runs as UID 65532 with a read-only root
# filesystem in the chart; it writes nothing but /tmp (an emptyDir there).
FROM scratch AS operator
LABEL org.opencontainers.image.title="holmes-operator" \
      org.opencontainers.image.description="Holmes Kubernetes operator: plans and runs HolmesJobs across heterogeneous NICs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
COPY --from=operator-root /rootfs/ /
ENV PATH=/opt/holmes/bin:/usr/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
# 8080: liveness (/healthz), 9090: Prometheus metrics; the chart's defaults.
EXPOSE 8080 9090
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["python", "-m", "holmes.operator"]
CMD ["--all-namespaces"]

# ---------------------------------------------------------------------------------------------
# trainer-venv: the contract and the trainer with torch (CUDA 13 build from PyPI, NCCL included);
# no kopf, no Kubernetes client.
FROM ${CUDA_IMAGE} AS trainer-venv
ARG PIP_CONFIG_FILE
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY docker/constraints.txt /tmp/constraints.txt
COPY --from=wheel /wheels/holmes_train_contract-*.whl /wheels/holmes_train_trainer-*.whl /wheels/
RUN python3 -m venv /opt/holmes \
 && /opt/holmes/bin/pip install --no-cache-dir --disable-pip-version-check \
      -c /tmp/constraints.txt /wheels/*.whl

# ---------------------------------------------------------------------------------------------
# trainer: the image HolmesJob pods run by default. rdma-core's user-space libraries let
# NCCL's IB transport use InfiniBand and RoCE HCAs (libibverbs + the mlx5/other providers,
# librdmacm); ibv_devinfo (ibverbs-utils) helps checking a node's HCAs from inside a pod.
FROM ${CUDA_IMAGE} AS trainer
LABEL org.opencontainers.image.title="holmes-trainer" \
      org.opencontainers.image.description="Holmes trainer: pipeline x data-parallel GPT training with an overlapped distributed optimizer (PyTorch, NCCL, RDMA)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
# The distribution is pinned by the base image tag; its packages take security updates.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libibverbs1 librdmacm1 ibverbs-providers ibverbs-utils \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 holmes \
 && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/holmes --shell /usr/sbin/nologin holmes
COPY --from=trainer-venv /opt/holmes /opt/holmes
ENV PATH=/opt/holmes/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
WORKDIR /home/holmes
# Training is a batch run: the pod's phase is its health, there is no server to probe.
HEALTHCHECK NONE
# The operator sets each pod's command (the launcher and the trainer's flags); this default only
# shows how to run the trainer by hand.
CMD ["python", "-m", "holmes.trainer", "--help"]
