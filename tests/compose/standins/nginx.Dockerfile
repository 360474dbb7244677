# Stand-in for nginx:1.27-alpine, for the compose tests on engines that cannot pull from Docker
# Hub (the lab of ../shared/compose-lab/ has stand-ins for the other base images, none for nginx).
# Built by tests/compose/helpers.py (nginx_standin) with --network none, from Debian bookworm's
# nginx and nginx-common .debs that `apt-get download` fetched on the host, on the
# python:3.11-slim stand-in (bookworm, wget included). It is nginx 1.22.1, not 1.27: the edge's
# docker/edge/nginx.conf keeps to what both versions read. Run as the official image runs it:
# the master as root, `nginx -g 'daemon off;'`, stopped with SIGQUIT (graceful).
ARG BASE=python:3.11-slim
FROM ${BASE}
COPY debs/ /tmp/debs/
# iproute2: only the package's init script wants it; nothing here runs that script
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
    && dpkg --ignore-depends=iproute2 -i /tmp/debs/*.deb \
    && rm -rf /tmp/debs /usr/sbin/policy-rc.d /etc/nginx/sites-enabled/default \
    && nginx -v && command -v wget
LABEL org.fedasync.stand-in="nginx:1.27-alpine: Debian bookworm's nginx 1.22.1 (tests/compose)"
EXPOSE 80 443
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
