# The device-worker image: the services image's code plus CPU-only torch and scikit-learn.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# CPU wheel first and pinned: an unpinned torch from PyPI is a multi-GB CUDA build.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY learning ./learning
COPY sim ./sim
RUN pip install ".[worker]" \
    && useradd --create-home --uid 10001 fedasync

USER fedasync
ENTRYPOINT ["fedasync"]
CMD ["--help"]
