// Package deploycheck keeps deploy/ honest: it reads every YAML and JSON
// file under deploy/ and checks what they name against the Go code, so a
// renamed flag, port, probe path or metric fails a test instead of a
// rollout.
//
// What is checked:
//
//   - images: ghcr.io/quotacoord/quota-<cmd>:<tag> needs a main package in
//     cmd/<cmd> and a tag other than latest; any other image must be in
//     ThirdPartyImages with a pinned tag;
//   - container args of our images: every -flag is defined by a flag set in
//     cmd/<cmd>, internal/<cmd> or a module package either imports (such as
//     internal/daemon's logging flags; found by parsing the Go source), and an
//     -*-addr flag's port is a declared containerPort;
//   - probes name a declared port and a path the command's code serves;
//     Services target a port some selected container declares;
//   - kustomizations: every resource, patch and generated file exists, and
//     JSON patches that replace container args pass the same flag checks;
//   - policy files (top-level "policies" or "domain") load with
//     internal/policy;
//   - Envoy bootstraps: the rate limit filter's domain is served by a
//     policy file in deploy/, its rate_limit_service cluster exists and
//     points at the regional node's gRPC port, every route's descriptor
//     matches a rule, and a filter that protects routes sets
//     failure_mode_deny: true (else a failed call admits the request);
//   - Envoy rate_limit_quota filters (RLQS, docs/rlqs.md): the config
//     decodes and passes Envoy's own validation (protoc-gen-validate),
//     rlqs_server is an envoy_grpc cluster on the regional node's gRPC
//     port, the domain is served by a policy file, and every bucket the
//     matchers build denies all before its first assignment and after one
//     expired (else Envoy admits outside any lease), reports in whole
//     seconds, and has an id matching a token-bucket or unlimited rule;
//   - Prometheus rules and Grafana dashboards: every metric in an expression
//     is registered by prometheus Opts or NewDesc in the module's code.
//
// Scan and Check are pure functions of their inputs apart from reading
// files; they are safe for concurrent use. The zero Code knows no command
// and no metric, so every reference fails.
package deploycheck
