#!/usr/bin/env bash
# Installs what the tests and the demo need from Debian when it is missing:
# redis-server (and redis-benchmark, in redis-tools), protoc and kubectl
# (which internal/deploycheck renders the kustomizations with) and promtool
# (in Debian's prometheus package; deploy/prometheus's rule tests run it). Needs root
# for apt-get; without root it only says what is missing.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v taskset >/dev/null || need+=(util-linux)
command -v kubectl >/dev/null || need+=(kubernetes-client)
command -v promtool >/dev/null || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing ${need[*]}; install them (sudo apt-get install ${need[*]}) or run as root" >&2
  exit 1
fi
echo "deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null; }
