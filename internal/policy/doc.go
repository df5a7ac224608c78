// Package policy loads and validates rate-limit policies: the project's own
// YAML format and Envoy rate limit service configuration files, both into
// the normalized Policy.
package policy
