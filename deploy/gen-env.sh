#!/usr/bin/env bash
# Write a .env for docker-compose.yml from .env.example, with a fresh random value for every secret
# the template leaves empty. Refuses to overwrite an existing file.
#
#   deploy/gen-env.sh [OUTPUT]                       default: .env beside docker-compose.yml
#   OASST_SERVER_API_ROOT=https://chat.example.org deploy/gen-env.sh
#
# Any variable of the template that is set in the environment is written with that value instead.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/.env}
SECRETS="POSTGRES_PASSWORD OASST_SERVER_AUTH_SECRET OASST_SERVER_ADMIN_ROOT_TOKEN OASST_WORKER_API_KEY GRAFANA_ADMIN_PASSWORD"

if [ -e "$OUT" ]; then
    echo "!!! $OUT exists: not overwriting it (remove it first to start afresh)" >&2
    exit 1
fi
random_hex() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

umask 077 # secrets: readable by the owner only
tmp=$(mktemp "$OUT.XXXXXX")
while IFS= read -r line || [ -n "$line" ]; do
    if [[ $line =~ ^([A-Z_][A-Z0-9_]*)=(.*)$ ]]; then
        name=${BASH_REMATCH[1]}
        value=${BASH_REMATCH[2]}
        if [ -n "${!name+set}" ]; then
            value=${!name}
        elif [ -z "$value" ] && [[ " $SECRETS " == *" $name "* ]]; then
            value=$(random_hex)
        fi
        printf '%s=%s\n' "$name" "$value"
    else
        printf '%s\n' "$line"
    fi
done <"$ROOT/.env.example" >"$tmp"
mv "$tmp" "$OUT"
echo ">>> wrote $OUT with new random secrets ($SECRETS)"
