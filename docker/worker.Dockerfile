# The device-worker image: the services image's code plus CPU-only torch and scikit-learn.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# CPU wheel first and pinned: an unpinned torch from PyPI is a multi-GB CUDA build. The `worker`
# extra pins the same version, so the next install finds it satisfied and fetches no other torch.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY learning ./learning
COPY sim ./sim
# the one package: its subpackages are links to the four folders above
COPY fedasync ./fedasync
RUN pip install ".[worker]" \
    && useradd --create-home --uid 10001 fedasync
# A task of your own (docs/your-model.md), as in docker/Dockerfile.
COPY examples ./examples
ARG TASK_PACKAGES=""
RUN if [ -n "$TASK_PACKAGES" ]; then pip install $TASK_PACKAGES; fi

USER fedasync
# No ENTRYPOINT: compose runs `python -m fedasync.services.worker`, and `fedasync ...` works as a command.
CMD ["fedasync", "--help"]
