# Redis from Debian's package, for machines without a container registry
# (scripts/build-images.sh). With a registry, docker-compose.yml uses the
# official image instead; both run the same command line.
ARG BASE_IMAGE=bloomcrawl-offline/debian:bookworm
FROM ${BASE_IMAGE}
RUN mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
EXPOSE 6379
CMD ["redis-server", "--bind", "0.0.0.0", "--daemonize", "no", "--dir", "/data"]
