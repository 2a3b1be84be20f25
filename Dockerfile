# A small image for the API and the workers of docker-compose.yml.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY sql ./sql
COPY notifyq ./notifyq
RUN pip install . \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin notifyq

USER notifyq
EXPOSE 8000
# Applies migrations (serialised by an advisory lock, so replicas may start together), then
# serves the API; docker-compose.yml runs `notifyq worker` from the same image. The API binds
# every interface of the container, so it needs NOTIFYQ_API_TOKEN: without one it stops at once
# with a one-line reason (NOTIFYQ_ALLOW_UNAUTHENTICATED=true opts out, for a private network).
CMD ["sh", "-c", "notifyq migrate && exec notifyq serve --host 0.0.0.0 --port 8000 --no-worker"]
