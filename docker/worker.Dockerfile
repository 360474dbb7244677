# The device-worker image: the services image's code plus CPU-only torch and scikit-learn.
# Builds without Docker Hub or PyPI: the same build arguments as docker/Dockerfile; with
# PIP_NO_INDEX=1 torch comes from the wheelhouse too, and download.pytorch.org is never asked.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

ARG PIP_INDEX_URL
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

WORKDIR /app
# CPU wheel first and pinned: an unpinned torch from PyPI is a multi-GB CUDA build. The `worker`
# extra pins the same version, so the next install finds it satisfied and fetches no other torch.
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    pip install torch==2.13.0 --index-url "$TORCH_INDEX_URL"
# The dependencies before the code, as in docker/Dockerfile (torch is already satisfied).
COPY pyproject.toml docker/requirements.py ./
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    python requirements.py worker >/tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt requirements.py
COPY README.md ./
COPY shared ./shared
COPY services ./services
COPY learning ./learning
COPY sim ./sim
# the one package: its subpackages are links to the four folders above
COPY fedasync ./fedasync
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    pip install ".[worker]" \
    && useradd --create-home --uid 10001 fedasync
# A task of your own (docs/your-model.md), as in docker/Dockerfile.
COPY examples ./examples
ARG TASK_PACKAGES=""
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    if [ -n "$TASK_PACKAGES" ]; then pip install $TASK_PACKAGES; fi

USER fedasync
# No ENTRYPOINT: compose runs `python -m fedasync.services.worker`, and `fedasync ...` works as a command.
CMD ["fedasync", "--help"]
