#!/bin/sh
# The official image's contract: options alone mean haproxy; run in the foreground, master-worker mode.
set -e
if [ "${1#-}" != "$1" ]; then
    set -- haproxy "$@"
fi
if [ "$1" = haproxy ]; then
    shift
    set -- haproxy -W -db "$@"
fi
exec "$@"
