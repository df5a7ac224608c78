package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ErrInvalid reports a policy file that cannot be used. Every error from
// Parse and Load wraps it and names the file, the policy and the field.
var ErrInvalid = errors.New("policy: invalid")

// Bounds on input, so that a hostile or broken file cannot exhaust memory.
const (
	// MaxFileBytes is the largest policy file accepted.
	MaxFileBytes = 4 << 20
	// MaxFiles is the most files Load reads from one directory.
	MaxFiles = 1000
	// MaxPolicies is the most policies (own or Envoy rules) in one file.
	MaxPolicies = 10000
)

// Parse reads one policy file. The format is detected from the top-level
// keys: "policies" is the project's own format, "domain" an Envoy rate
// limit service configuration. filename is used in error messages and
// recorded as each policy's Source.
func Parse(filename string, data []byte) (*Set, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes, more than %d", ErrInvalid, filename, len(data), MaxFileBytes)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrInvalid, filename, cleanYAMLError(err))
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return nil, fmt.Errorf("%w: %s: empty file, want a \"policies:\" list or an Envoy \"domain:\"", ErrInvalid, filename)
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: %s: line %d: top level must be a mapping with \"policies\" or \"domain\"", ErrInvalid, filename, doc.Line)
	}
	var own, envoy bool
	for i := 0; i+1 < len(doc.Content); i += 2 {
		switch doc.Content[i].Value {
		case "policies":
			own = true
		case "domain":
			envoy = true
		}
	}
	switch {
	case own && envoy:
		return nil, fmt.Errorf("%w: %s: both \"policies\" and \"domain\": a file is either the own format or an Envoy configuration", ErrInvalid, filename)
	case own:
		return parseOwn(filename, data, doc)
	case envoy:
		return parseEnvoy(filename, data)
	default:
		return nil, fmt.Errorf("%w: %s: no \"policies\" or \"domain\" key at the top level", ErrInvalid, filename)
	}
}

// Load reads one policy file, or every *.yaml and *.yml file of a
// directory (not its subdirectories) in name order, and merges them.
func Load(path string) (*Set, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("policy: load: %w", err)
	}
	if !info.IsDir() {
		return loadFile(path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("policy: load: %w", err)
	}
	var names []string
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if e.Type().IsRegular() && (ext == ".yaml" || ext == ".yml") && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	if len(names) > MaxFiles {
		return nil, fmt.Errorf("%w: %s: %d policy files, more than %d", ErrInvalid, path, len(names), MaxFiles)
	}
	sets := make([]*Set, 0, len(names))
	for _, n := range names {
		s, err := loadFile(filepath.Join(path, n))
		if err != nil {
			return nil, err
		}
		sets = append(sets, s)
	}
	return Merge(sets...)
}

func loadFile(path string) (*Set, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: load: %w", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	// Read one byte more than allowed so Parse reports the size.
	if _, err := buf.ReadFrom(io.LimitReader(f, MaxFileBytes+1)); err != nil {
		return nil, fmt.Errorf("policy: load %s: %w", path, err)
	}
	return Parse(path, buf.Bytes())
}

// decodeStrict decodes data into v, rejecting unknown fields.
func decodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// cleanYAMLError drops the Go type names yaml.v3 puts in its messages.
func cleanYAMLError(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: ")
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n")
	for _, t := range []string{" in type policy.ownPolicy", " in type policy.ownFile", " in type policy.envoyFile",
		" in type policy.envoyDescriptor", " in type policy.envoyRateLimit", " in type policy.envoyReplaces"} {
		msg = strings.ReplaceAll(msg, t, "")
	}
	lines := strings.Split(msg, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return strings.Join(lines, "; ")
}

// yamlErrorLines returns the line numbers a yaml.v3 error names.
func yamlErrorLine(err error) int {
	var te *yaml.TypeError
	if !errors.As(err, &te) || len(te.Errors) == 0 {
		return 0
	}
	var line int
	if _, e := fmt.Sscanf(te.Errors[0], "line %d:", &line); e != nil {
		return 0
	}
	return line
}
