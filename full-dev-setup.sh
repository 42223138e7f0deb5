#!/usr/bin/env bash
# The whole stack for development in one tmux session, a pane per process: the bundled CPU backend
# (SmolLM2), the server, two workers, the text-client and, when the local Postgres and Redis are used,
# a pane watching them. No Docker needed.
#
#   ./full-dev-setup.sh           start; attaches when run from a terminal
#   ./full-dev-setup.sh stop      stop every process it started and close the session
#   ./full-dev-setup.sh status    show the panes and whether their processes run
#   ./full-dev-setup.sh attach    attach to the running session
#
# The server uses the local Postgres and Redis when both answer, else SQLite and the in-process
# broker. Settings (environment variables, all optional):
#   OASST_DEV_SESSION        tmux session (and tmux socket) name            [oasst-inference]
#   OASST_DEV_MODE           auto | local (Postgres + Redis) | embedded     [auto]
#   OASST_DEV_POSTGRES_URL   the local Postgres, any database   [postgresql://postgres@127.0.0.1:5432/postgres]
#   OASST_DEV_DATABASE       database created there if missing              [oasst_dev]
#   OASST_DEV_REDIS_URL      the local Redis                                [redis://127.0.0.1:6379/0]
#   OASST_DEV_REDIS_PREFIX   prefix of every Redis key of this stack        [oasst-dev:]
#   OASST_DEV_SQLITE_PATH    database file in embedded mode                [.data/oasst-dev.db]
#   OASST_SERVER_PORT        server port                                    [8000]
#   OASST_CPU_BACKEND_PORT   CPU backend port                               [8001]
#   OASST_DEV_CHAT_ARGS      extra arguments of oasst-chat, e.g. "--greedy --max-new-tokens 64"
#   OASST_DEV_TIMEOUT        seconds to wait for the stack to come up       [300]
#   OASST_DEV_ATTACH         1: attach after start, 0: don't     [1 when run from a terminal]
# Any other OASST_* variable (e.g. OASST_CPU_BACKEND_N_THREADS) reaches the processes unchanged.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$ROOT"
SESSION=${OASST_DEV_SESSION:-oasst-inference}
MODE=${OASST_DEV_MODE:-auto}
POSTGRES_URL=${OASST_DEV_POSTGRES_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
DATABASE=${OASST_DEV_DATABASE:-oasst_dev}
REDIS_URL=${OASST_DEV_REDIS_URL:-redis://127.0.0.1:6379/0}
REDIS_PREFIX=${OASST_DEV_REDIS_PREFIX:-oasst-dev:}
SQLITE_PATH=${OASST_DEV_SQLITE_PATH:-.data/oasst-dev.db}
SERVER_PORT=${OASST_SERVER_PORT:-8000}
BACKEND_PORT=${OASST_CPU_BACKEND_PORT:-8001}
TIMEOUT=${OASST_DEV_TIMEOUT:-300}
PY="$ROOT/.venv/bin/python"
SERVER_URL="http://127.0.0.1:$SERVER_PORT"
BACKEND_URL="http://127.0.0.1:$BACKEND_PORT"
# Every process of the stack carries this variable, so `stop` finds even one that left its pane's
# process group.
MARKER="$ROOT#$SESSION"

say() { printf '>>> %s\n' "$*"; }
die() {
    printf '!!! %s\n' "$*" >&2
    exit 1
}
# A tmux server of our own: its environment is this shell's, and `stop` can end it whole.
tm() { tmux -L "$SESSION" "$@"; }
running() { tm has-session -t "=$SESSION" 2>/dev/null; }

require_tmux() {
    command -v tmux >/dev/null 2>&1 || die "tmux is not installed: install it (Debian/Ubuntu: apt-get install tmux; macOS: brew install tmux)"
}

# ---------------------------------------------------------------- checks that need the venv's Python

http_ok() { "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" >/dev/null 2>&1; }

model_ready() {
    "$PY" - "$SERVER_URL" <<'EOF' >/dev/null 2>&1
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/configs/model_configs", timeout=2) as response:
    sys.exit(0 if json.load(response) else 1)
EOF
}

port_free() {
    "$PY" - "$1" <<'EOF'
import socket, sys
with socket.socket() as sock:
    sock.settimeout(0.5)
    sys.exit(1 if sock.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 0)
EOF
}

# Prints nothing and succeeds when the local Postgres and Redis answer; creates the database if missing.
prepare_local_services() {
    "$PY" - "$POSTGRES_URL" "$DATABASE" "$REDIS_URL" <<'EOF'
import asyncio, sys

import asyncpg
import redis

admin_url, database, redis_url = sys.argv[1:]


async def ensure_database() -> None:
    conn = await asyncpg.connect(admin_url, timeout=3)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database):
            await conn.execute(f'CREATE DATABASE "{database}"')
            print(f"created database {database}", file=sys.stderr)
    finally:
        await conn.close()


try:
    redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=2).ping()
except Exception as exc:
    print(f"Redis at {redis_url} does not answer ({type(exc).__name__})")
    sys.exit(1)
try:
    asyncio.run(ensure_database())
except Exception as exc:
    print(f"Postgres at {admin_url} does not answer ({type(exc).__name__}: {exc})")
    sys.exit(1)
EOF
}

# The pane that watches the local Postgres and Redis.
read -r -d '' SERVICES_WATCH <<'EOF' || true
import asyncio, datetime, os, sys, time

import asyncpg
import redis

database_url, redis_url, prefix = sys.argv[1:]
client = redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=2)


async def database_state() -> str:
    conn = await asyncpg.connect(database_url, timeout=3)
    try:
        size = await conn.fetchval("SELECT pg_size_pretty(pg_database_size(current_database()))")
        connections = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        )
        return f"ok, {size}, {connections} connections"
    finally:
        await conn.close()


print(f"Postgres {database_url}\nRedis    {redis_url} (keys {prefix}*)\n", flush=True)
while True:
    try:
        pg = asyncio.run(database_state())
    except Exception as exc:
        pg = f"DOWN ({type(exc).__name__})"
    try:
        keys = sum(1 for _ in client.scan_iter(match=f"{prefix}*", count=1000))
        memory = client.info("memory")
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy", "?")
        rd = f"ok, {keys} keys, {memory['used_memory_human']} used, maxmemory-policy {policy}"
    except Exception as exc:
        rd = f"DOWN ({type(exc).__name__})"
    print(f"{datetime.datetime.now():%H:%M:%S}  postgres: {pg} | redis: {rd}", flush=True)
    time.sleep(5)
EOF

# ---------------------------------------------------------------- commands

start() {
    require_tmux
    if running; then
        die "the session $SESSION is already running: attach with '$0 attach', or stop it with '$0 stop'"
    fi
    say "preparing the virtual environment (make venv)"
    make --no-print-directory venv
    [ -x "$PY" ] || die "make venv did not create $PY"

    for entry in "server:$SERVER_PORT:OASST_SERVER_PORT" "CPU backend:$BACKEND_PORT:OASST_CPU_BACKEND_PORT"; do
        IFS=: read -r what port variable <<<"$entry"
        port_free "$port" || die "port $port ($what) is in use: stop what runs there, or set $variable"
    done

    local database_url broker_url mode_text reason postgres_dsn=""
    case "$MODE" in
        auto | local)
            if reason=$(prepare_local_services); then
                MODE=local
            elif [ "$MODE" = local ]; then
                die "OASST_DEV_MODE=local but $reason"
            else
                say "$reason: using SQLite and the in-process broker instead"
                MODE=embedded
            fi
            ;;
        embedded) ;;
        *) die "OASST_DEV_MODE must be auto, local or embedded (got $MODE)" ;;
    esac
    if [ "$MODE" = local ]; then
        postgres_dsn="${POSTGRES_URL%/*}/$DATABASE"
        database_url="postgresql+asyncpg://${postgres_dsn#*://}"
        broker_url=$REDIS_URL
        mode_text="Postgres (database $DATABASE) and Redis (prefix $REDIS_PREFIX)"
    else
        mkdir -p "$(dirname "$SQLITE_PATH")"
        database_url="sqlite+aiosqlite:///$SQLITE_PATH"
        broker_url="memory://"
        mode_text="SQLite ($SQLITE_PATH) and the in-process broker"
    fi
    say "starting tmux session $SESSION: $mode_text"

    local common=(env "OASST_DEV_MARKER=$MARKER" PYTHONUNBUFFERED=1)
    local worker_env=("${common[@]}" "OASST_WORKER_SERVER_URL=ws://127.0.0.1:$SERVER_PORT"
        "OASST_WORKER_BACKEND_URL=$BACKEND_URL")
    local chat_args=()
    read -r -a chat_args <<<"${OASST_DEV_CHAT_ARGS:-}"

    # The first pane runs a placeholder until the session's options are set, so that no pane can
    # die (and vanish with its error) before remain-on-exit is on. No user tmux.conf: the layout and
    # the pane targets below must not depend on it.
    PLACEHOLDER=$(tm -f /dev/null new-session -d -P -F '#{pane_id}' -s "$SESSION" -n stack -x 220 -y 60 \
        -c "$ROOT" sleep 86400)
    tm set-option -w -t "$SESSION:stack" remain-on-exit on
    tm set-option -w -t "$SESSION:stack" pane-border-status top
    tm set-option -w -t "$SESSION:stack" pane-border-format \
        ' #{pane_index}: #{@role} #{?pane_dead,(exited #{pane_dead_status}),} '
    tm set-option -t "$SESSION" mouse on
    tm set-option -t "$SESSION" status-left "[$SESSION] "
    tm set-option -t "$SESSION" status-left-length 40

    pane() { # pane ROLE COMMAND... : the first one replaces the placeholder
        local role=$1 target
        shift
        if [ -n "$PLACEHOLDER" ]; then
            target=$PLACEHOLDER
            PLACEHOLDER=""
            tm respawn-pane -k -t "$target" -c "$ROOT" "$@"
        else
            target=$(tm split-window -d -P -F '#{pane_id}' -t "$SESSION:stack" -c "$ROOT" "$@")
            tm select-layout -t "$SESSION:stack" tiled >/dev/null
        fi
        tm set-option -p -t "$target" @role "$role"
    }

    pane backend "${common[@]}" OASST_CPU_BACKEND_HOST=127.0.0.1 "OASST_CPU_BACKEND_PORT=$BACKEND_PORT" \
        "$ROOT/.venv/bin/oasst-cpu-backend"
    pane server "${common[@]}" OASST_SERVER_ENVIRONMENT=development OASST_SERVER_HOST=127.0.0.1 "OASST_SERVER_PORT=$SERVER_PORT" \
        "OASST_SERVER_DATABASE_URL=$database_url" "OASST_SERVER_BROKER_URL=$broker_url" \
        "OASST_SERVER_REDIS_KEY_PREFIX=$REDIS_PREFIX" "$ROOT/.venv/bin/oasst-server"
    pane worker-1 "${worker_env[@]}" "$ROOT/.venv/bin/oasst-worker"
    pane worker-2 "${worker_env[@]}" "$ROOT/.venv/bin/oasst-worker"
    if [ "$MODE" = local ]; then
        pane services "${common[@]}" "$PY" -c "$SERVICES_WATCH" "$postgres_dsn" "$REDIS_URL" "$REDIS_PREFIX"
    fi
    # The client starts once a worker has registered a model; before that it would find none.
    # shellcheck disable=SC2016 # the script is expanded by the bash in the pane
    pane chat "${common[@]}" bash -c '
        echo "waiting for a model at $1 ..."
        until "$2" -c "import json, sys, urllib.request; sys.exit(0 if json.load(urllib.request.urlopen(sys.argv[1] + \"/configs/model_configs\", timeout=2)) else 1)" "$1" 2>/dev/null; do
            sleep 1
        done
        shift 2
        exec "$@"' chat-pane "$SERVER_URL" "$PY" "$ROOT/.venv/bin/oasst-chat" --server-url "$SERVER_URL" \
        ${chat_args[@]+"${chat_args[@]}"}
    tm select-pane -t "$(pane_of chat)"

    say "waiting for the backend, the server and a worker (up to ${TIMEOUT}s)"
    local deadline=$((SECONDS + TIMEOUT)) backend_up="" server_up=""
    while :; do
        local dead
        dead=$(tm list-panes -s -t "$SESSION" -F '#{pane_dead} #{@role}' | awk '$1 == 1 {print $2}')
        if [ -n "$dead" ]; then
            for role in $dead; do
                printf '!!! %s exited; its last lines:\n' "$role" >&2
                tm capture-pane -p -t "$(pane_of "$role")" | grep -v '^$' | tail -15 >&2
            done
            die "the stack did not come up; look at the session ('$0 attach'), then '$0 stop'"
        fi
        [ -n "$backend_up" ] || { http_ok "$BACKEND_URL/health" && backend_up=1 && say "backend up at $BACKEND_URL"; } || true
        [ -n "$server_up" ] || { http_ok "$SERVER_URL/health" && server_up=1 && say "server up at $SERVER_URL"; } || true
        if [ -n "$backend_up" ] && [ -n "$server_up" ] && model_ready; then
            break
        fi
        [ "$SECONDS" -lt "$deadline" ] || die "the stack did not come up in ${TIMEOUT}s; look at the session ('$0 attach'), then '$0 stop'"
        sleep 1
    done
    local again=$0
    [ "$SESSION" = oasst-inference ] || again="OASST_DEV_SESSION=$SESSION $0"
    cat <<EOF

The stack is up in tmux session $SESSION ($mode_text).
  web chat:      $SERVER_URL/
  REST API docs: $SERVER_URL/docs
  text-client:   the 'chat' pane
  attach:        $again attach      (or: tmux -L $SESSION attach -t $SESSION)
  stop:          $again stop
EOF
    local attach=${OASST_DEV_ATTACH:-}
    if [ -z "$attach" ]; then
        if [ -t 0 ] && [ -t 1 ]; then attach=1; else attach=0; fi
    fi
    if [ "$attach" = 1 ]; then
        attach_session
    fi
}

pane_of() { tm list-panes -s -t "$SESSION" -F '#{pane_id} #{@role}' | awk -v role="$1" '$2 == role {print $1}'; }

attach_session() {
    require_tmux
    running || die "no session $SESSION is running"
    # Inside another tmux: attach nested (our session lives on its own tmux server).
    TMUX='' tm attach-session -t "$SESSION"
}

status() {
    require_tmux
    if ! running; then
        echo "no session $SESSION is running"
        return 1
    fi
    tm list-panes -s -t "$SESSION" -F '#{@role} pid #{pane_pid} #{?pane_dead,exited (#{pane_dead_status}),running}'
}

# The process groups still alive among the given ones.
alive_groups() {
    local group
    for group in "$@"; do
        if kill -0 -- "-$group" 2>/dev/null; then echo "$group"; fi
    done
}

stop_groups() { # stop_groups SECONDS PGID... : SIGTERM, wait, then SIGKILL
    local wait_for=$1 group
    shift
    [ $# -gt 0 ] || return 0
    for group in "$@"; do kill -TERM -- "-$group" 2>/dev/null || true; done
    local deadline=$((SECONDS + wait_for))
    while [ -n "$(alive_groups "$@")" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    for group in $(alive_groups "$@"); do
        echo "    process group $group did not stop in ${wait_for}s: killing it"
        kill -KILL -- "-$group" 2>/dev/null || true
    done
}

# Processes that carry this stack's marker (Linux: read from /proc), except this script's own.
marked_processes() {
    [ -d /proc ] || return 0
    local environ pid
    for environ in /proc/[0-9]*/environ; do
        pid=${environ#/proc/}
        pid=${pid%/environ}
        [ "$pid" != "$$" ] || continue
        if grep -qzxF "OASST_DEV_MARKER=$MARKER" "$environ" 2>/dev/null; then
            echo "$pid"
        fi
    done
}

stop() {
    require_tmux
    if running; then
        say "stopping the session $SESSION"
        local groups=() pid dead
        while read -r pid dead; do
            # Each pane's process leads its own process group (tmux starts it with setsid).
            [ "$dead" = 1 ] || groups+=("$pid")
        done < <(tm list-panes -s -t "$SESSION" -F '#{pane_pid} #{pane_dead}')
        # All at once: a worker asked to stop finishes its in-flight answer unless the server goes
        # away too, which cancels it; the backend stops a generation whose client left.
        stop_groups 20 ${groups[@]+"${groups[@]}"}
        tm kill-server 2>/dev/null || true
    else
        say "no session $SESSION is running"
    fi
    local leftovers
    leftovers=$(marked_processes)
    if [ -n "$leftovers" ]; then
        echo "    killing leftover processes of the stack: $(echo "$leftovers" | tr '\n' ' ')"
        # shellcheck disable=SC2086
        kill -KILL $leftovers 2>/dev/null || true
    fi
    say "stopped"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    attach) attach_session ;;
    -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
    *) die "usage: $0 [start|stop|status|attach]" ;;
esac
