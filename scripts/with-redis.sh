#!/usr/bin/env bash
# Runs a command with REDIS_ADDR pointing at a fresh redis-server on a free
# loopback port, started here and stopped (by its PID) when the command ends.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)))
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$dir" \
  --daemonize no --logfile "$dir/redis.log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
for _ in $(seq 1 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
redis-cli -p "$port" ping >/dev/null || { echo "with-redis: redis-server did not start:"; cat "$dir/redis.log"; exit 1; }
export REDIS_ADDR=127.0.0.1:$port
echo "with-redis: redis-server pid $pid on $REDIS_ADDR" >&2
"$@"
