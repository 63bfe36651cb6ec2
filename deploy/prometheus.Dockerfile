# Prometheus from Debian's package, for machines without a container registry
# (scripts/build-images.sh). With a registry, docker-compose.yml uses the
# official image instead; both run the same command line.
ARG BASE_IMAGE=bloomcrawl-offline/debian:bookworm
FROM ${BASE_IMAGE}
RUN mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
