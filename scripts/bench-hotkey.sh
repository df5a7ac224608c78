#!/usr/bin/env bash
# bench-hotkey.sh: one global bucket (one policy, one subject) on a Redis
# Cluster of 1 and of 3 masters, whole and split into 6 sub-buckets
# (bucket.Limits.Shards), with the store's default Merge and with Merge 1,
# by BenchmarkHotKey; writes the table into
# docs/hotkey.md between its bench-hotkey markers. Starts real redis-server
# processes in cluster mode on free loopback ports (3 masters joined by
# redis-cli --cluster create; 1 master given every slot with CLUSTER
# ADDSLOTSRANGE, since --cluster create wants at least 3) and stops them
# by PID at exit. HOTKEY_BENCHTIME (default 3s) is each case's duration.
#
# Then it runs the cases again with every redis-server held to
# HOTKEY_MASTER_CPU of one core (default 0.25) by its own cgroup CPU quota
# (cgroup v2 cpu.max or v1 cpu.cfs_quota_us; needs root, skipped without
# it unless HOTKEY_MASTER_CPU is set), so that the
# masters, not the client sharing their cores, are the limit, as with
# masters on machines of their own: the table between the
# bench-hotkey-capped markers shows how decisions per second grow with
# masters. HOTKEY_MASTER_CPU=0 skips that run.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v redis-server >/dev/null || { echo "bench-hotkey: redis-server not installed (make deps)" >&2; exit 1; }
command -v redis-cli >/dev/null || { echo "bench-hotkey: redis-cli not installed (make deps)" >&2; exit 1; }
benchtime=${HOTKEY_BENCHTIME:-3s}
[[ $benchtime =~ ^[0-9]+(ms|s)$ ]] || { echo "bench-hotkey: HOTKEY_BENCHTIME $benchtime is not like 3s or 500ms" >&2; exit 1; }
master_cpu=${HOTKEY_MASTER_CPU:-0.25}
if [[ -z ${HOTKEY_MASTER_CPU:-} && $EUID -ne 0 ]]; then
  echo "bench-hotkey: not root, so no cgroup CPU quota: the capped run is skipped (set HOTKEY_MASTER_CPU to insist)" >&2
  master_cpu=0
fi
[[ $master_cpu =~ ^(0|0?\.[0-9]+|1(\.0+)?)$ ]] || { echo "bench-hotkey: HOTKEY_MASTER_CPU $master_cpu is not a fraction of one core in [0, 1]" >&2; exit 1; }

dir=$(mktemp -d)
pids=()
cgroups=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]+"${pids[@]}"}"; do wait "$p" 2>/dev/null || true; done
  for g in "${cgroups[@]+"${cgroups[@]}"}"; do rmdir "$g" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# start_node: one redis-server in cluster mode, its PID kept for cleanup
# (so it runs in this shell, not a command substitution); sets $port.
start_node() {
  local bus d
  port=$(freeport)
  bus=$(freeport)
  d="$dir/$port"
  mkdir -p "$d"
  redis-server --bind 127.0.0.1 --port "$port" --cluster-enabled yes --cluster-port "$bus" \
    --cluster-config-file nodes.conf --cluster-node-timeout 5000 --save '' --appendonly no \
    --dir "$d" --logfile "$d/redis.log" --daemonize no --protected-mode no >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  redis-cli -p "$port" ping >/dev/null || { echo "bench-hotkey: redis-server on $port did not start: $(tail -5 "$d/redis.log")" >&2; exit 1; }
}

# wait_ok port...: until every node reports cluster_state:ok.
wait_ok() {
  for _ in $(seq 200); do
    local ok=1
    for p in "$@"; do redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok' || ok=0; done
    [[ $ok == 1 ]] && return 0
    sleep 0.05
  done
  echo "bench-hotkey: cluster on ports $* not ok" >&2
  exit 1
}

start_node
p1=$port
redis-cli -p "$p1" cluster addslotsrange 0 16383 >/dev/null
wait_ok "$p1"

p3=()
for _ in 1 2 3; do
  start_node
  p3+=("$port")
done
redis-cli --cluster create "${p3[@]/#/127.0.0.1:}" --cluster-yes >"$dir/create.log" 2>&1 ||
  { echo "bench-hotkey: redis-cli --cluster create failed:" >&2; cat "$dir/create.log" >&2; exit 1; }
wait_ok "${p3[@]}"
echo "== clusters: 1 master on $p1 (pid ${pids[0]}); 3 masters on ${p3[*]} (pids ${pids[*]:1})"

go test -c -o "$dir/bucket.test" ./bucket/
clusters="1=127.0.0.1:$p1;3=127.0.0.1:${p3[0]},127.0.0.1:${p3[1]},127.0.0.1:${p3[2]}"
# bench OUT: every case once, its output in OUT.
bench() {
  (cd bucket && HOTKEY_CLUSTERS="$clusters" "$dir/bucket.test" -test.run '^$' -test.bench '^BenchmarkHotKey$' \
    -test.benchtime "$benchtime") | tee "$1"
}

# cap_cpu PID NAME: holds PID to $master_cpu of one core in a cgroup of
# its own named NAME (removed at exit).
cap_cpu() {
  local quota g
  quota=$(awk -v f="$master_cpu" 'BEGIN { printf "%d", f * 100000 }')
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    g=/sys/fs/cgroup/$2
    mkdir -p "$g" && cgroups+=("$g")
    echo "$quota 100000" >"$g/cpu.max"
  else
    g=/sys/fs/cgroup/cpu/$2
    mkdir -p "$g" && cgroups+=("$g")
    echo 100000 >"$g/cpu.cfs_period_us"
    echo "$quota" >"$g/cpu.cfs_quota_us"
  fi
  echo "$1" >"$g/cgroup.procs"
}

# table OUT TITLE: one row per case; the ceiling is the rate at which the
# busiest master would spend one whole core (10^6 / its CPU µs per
# decision); the last two columns compare 3 masters with 1 for the same
# split, all from this one run.
table() {
awk -v title="$2" -v bt="$benchtime" '
  /^BenchmarkHotKey\/masters=/ {
    split($1, a, "/"); m = substr(a[2], 9); k = a[3]; sub(/^shards=/, "", k)
    g = a[4]; sub(/^merge=/, "", g); sub(/-[0-9]+$/, "", g); k = g "/" k
    for (i = 2; i <= NF; i++) {
      if ($(i+1) == "decisions/s") d[m, k] = $i
      if ($(i+1) == "busiest-master-%") b[m, k] = $i
      if ($(i+1) == "busiest-master-µs/decision") u[m, k] = $i
    }
    if (!(k in seenk)) { seenk[k] = 1; ks[++nk] = k }
  }
  END {
    printf "%s, %s per case, 64 callers, one run:\n\n", title, bt
    print "| merge | masters | sub-buckets | decisions/s | busiest master: % of Redis CPU | busiest master: CPU µs per decision | ceiling: decisions/s at one busy core | ceiling, 3 masters / 1 | decisions/s, 3 masters / 1 |"
    print "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for (j = 1; j <= nk; j++) {
      k = ks[j]
      for (m = 1; m <= 3; m += 2) {
        if (!((m, k) in d) || u[m, k] <= 0) { print "bench-hotkey: no figure for masters=" m " shards=" k > "/dev/stderr"; exit 1 }
        cr = (m == 3) ? sprintf("%.2f", u[1, k] / u[3, k]) : ""
        dr = (m == 3 && d[1, k] > 0) ? sprintf("%.2f", d[3, k] / d[1, k]) : ""
        split(k, gk, "/")
        printf "| %s | %d | %s | %.0f | %.0f | %.2f | %.0f | %s | %s |\n", (gk[1] == 0 ? "default" : gk[1]), m, gk[2], d[m, k], b[m, k], u[m, k], 1e6 / u[m, k], cr, dr
      }
    }
  }' "$1"
}

# splice MARKER TABLE: TABLE replaces what docs/hotkey.md holds between
# its MARKER:begin and MARKER:end comments.
doc=docs/hotkey.md
splice() {
  grep -q "<!-- $1:begin -->" "$doc" && grep -q "<!-- $1:end -->" "$doc" ||
    { echo "bench-hotkey: $doc lacks the $1 markers" >&2; exit 1; }
  printf '%s\n' "$2" >"$dir/table"
  awk -v t="$dir/table" -v b="<!-- $1:begin -->" -v e="<!-- $1:end -->" '
    $0 == b { print; while ((getline l < t) > 0) print l; skip = 1; next }
    $0 == e { skip = 0 }
    !skip' "$doc" >"$dir/doc" && cp "$dir/doc" "$doc"
  echo "== $doc ($1)"
  printf '%s\n' "$2"
}

bench "$dir/bench.out"
shared=$(table "$dir/bench.out" "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) CPUs shared with other work") || exit 1

capped=""
if [[ $master_cpu != 0 && $master_cpu != 0.0 ]]; then
  i=0
  for p in "${pids[@]}"; do
    cap_cpu "$p" "quota-bench-hotkey-$$-$i" || { echo "bench-hotkey: cannot cap redis-server $p in a cgroup (root and a cpu controller needed; HOTKEY_MASTER_CPU=0 skips this run)" >&2; exit 1; }
    i=$((i + 1))
  done
  echo "== every redis-server held to $master_cpu of one core"
  bench "$dir/capped.out"
  capped=$(table "$dir/capped.out" "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) CPUs, every redis-server held to $master_cpu of one core by a cgroup CPU quota") || exit 1
fi
splice bench-hotkey "$shared"
[[ -z $capped ]] || splice bench-hotkey-capped "$capped"
