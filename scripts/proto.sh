#!/usr/bin/env bash
# Regenerates the Go code for every .proto under proto/ with the plugin
# versions pinned in go.mod (tool directives) and Debian's protoc.
# PROTO_OUT=DIR writes elsewhere (the staleness test compares against it).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v protoc >/dev/null || { echo "proto: protoc missing; run scripts/deps.sh (apt-get install protobuf-compiler)" >&2; exit 1; }
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
out=${PROTO_OUT:-proto}
mkdir -p "$out"
protoc -I proto \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
  --go_out=paths=source_relative:"$out" \
  --go-grpc_out=paths=source_relative:"$out" \
  $(find proto -name '*.proto' | sort)
