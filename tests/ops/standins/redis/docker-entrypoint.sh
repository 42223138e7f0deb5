#!/bin/sh
# The official image's contract: options alone mean redis-server; protected mode is off by default
# (the official image patches that default; the container's network is the protection).
set -e
if [ "${1#-}" != "$1" ]; then
    set -- redis-server "$@"
fi
if [ "$1" = redis-server ]; then
    shift
    set -- redis-server --protected-mode no "$@"
fi
exec "$@"
