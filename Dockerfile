# The one FlexInfer image: `flexinfer manager` (operator), `flexinfer proxy` (OpenAI-compatible edge)
# and `flexinfer flash-load` (the flash-loader init container the manager injects into model pods).
# The Helm chart (charts/flexinfer) runs all three from this image, tagged with the package version.
#
#   docker build -t ghcr.io/flexinfer/flexinfer:0.1.0 .

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --root-user-action=ignore --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# Non-root user matching the chart's securityContext (runAsUser/runAsGroup 65532).
RUN groupadd --gid 65532 flexinfer \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin flexinfer
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 8081
ENTRYPOINT ["flexinfer"]
CMD ["--help"]
