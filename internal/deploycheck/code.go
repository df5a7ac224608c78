package deploycheck

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrNoModule says no go.mod was found above the starting directory.
var ErrNoModule = errors.New("deploycheck: no go.mod above the directory")

// Command is what the code of one cmd/<name> defines.
type Command struct {
	// Flags maps flag name (without dashes) to its default when the default
	// is a literal, else "".
	Flags map[string]string
	// Paths holds every string literal starting with "/" in the command's
	// packages: the HTTP paths it can serve, among others.
	Paths map[string]bool
}

// Code is what the module's Go source defines, as far as deploy/ cares.
type Code struct {
	// Commands maps a cmd/<name> directory with a main package to its flags
	// and paths (taken from cmd/<name> and internal/<name>).
	Commands map[string]Command
	// Metrics holds every metric name the code registers, with the series
	// suffixes of histograms and summaries.
	Metrics map[string]bool
	// MetricPrefixes are prefixes of names registered by standard
	// collectors the code uses (go_, process_).
	MetricPrefixes []string
}

// HasMetric reports whether name is registered by the code.
func (c Code) HasMetric(name string) bool {
	if c.Metrics[name] {
		return true
	}
	for _, p := range c.MetricPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// ModuleRoot returns the directory holding go.mod at or above dir.
func ModuleRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("deploycheck: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("%w %s", ErrNoModule, dir)
		}
		d = parent
	}
}

// maxGoFiles bounds how many Go files Scan parses.
const maxGoFiles = 20000

// Scan parses the module's non-test Go files under root (skipping deploy/,
// testdata and hidden directories) and returns the commands and metrics
// they define.
func Scan(root string) (Code, error) {
	code := Code{Commands: map[string]Command{}, Metrics: map[string]bool{}}
	files := map[string][]*ast.File{} // package directory (slash, relative) -> files
	fset := token.NewFileSet()
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "deploy" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		if n++; n > maxGoFiles {
			return fmt.Errorf("more than %d Go files", maxGoFiles)
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		files[rel] = append(files[rel], f)
		return nil
	})
	if err != nil {
		return Code{}, fmt.Errorf("deploycheck: scan %s: %w", root, err)
	}
	module, err := modulePath(root)
	if err != nil {
		return Code{}, err
	}
	dirs := make([]string, 0, len(files))
	for d := range files {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, dir := range dirs {
		pkg := files[dir]
		consts := stringConsts(pkg)
		for _, f := range pkg {
			metricsOf(f, consts, &code)
		}
		name, ok := strings.CutPrefix(dir, "cmd/")
		if !ok || strings.Contains(name, "/") || pkg[0].Name.Name != "main" {
			continue
		}
		cmd := Command{Flags: map[string]string{}, Paths: map[string]bool{}}
		own := []string{dir, "internal/" + name}
		for _, d := range append(own, moduleImports(module, files, own)...) {
			dc := stringConsts(files[d])
			for _, f := range files[d] {
				flagsOf(f, dc, cmd.Flags)
				pathsOf(f, cmd.Paths)
			}
		}
		code.Commands[name] = cmd
	}
	return code, nil
}

// modulePath is the module path declared in root/go.mod.
func modulePath(root string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("deploycheck: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("deploycheck: %s/go.mod declares no module", root)
}

// moduleImports lists the directories (relative to the module root, in
// order, without dirs themselves) of the module's packages that the files
// in dirs import: a command's flags may be registered by a shared package.
func moduleImports(module string, files map[string][]*ast.File, dirs []string) []string {
	seen := map[string]bool{}
	for _, d := range dirs {
		seen[d] = true
	}
	var out []string
	for _, d := range dirs {
		for _, f := range files[d] {
			for _, imp := range f.Imports {
				path, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					continue
				}
				rel, ok := strings.CutPrefix(path, module+"/")
				if !ok || seen[rel] {
					continue
				}
				seen[rel] = true
				out = append(out, rel)
			}
		}
	}
	sort.Strings(out)
	return out
}

// stringConsts maps the package-level string constants of pkg to values.
func stringConsts(pkg []*ast.File) map[string]string {
	out := map[string]string{}
	for _, f := range pkg {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						if s, ok := literal(vs.Values[i], nil); ok {
							out[n.Name] = s
						}
					}
				}
			}
		}
	}
	return out
}

// literal returns the string value of a string literal or a known constant.
func literal(e ast.Expr, consts map[string]string) (string, bool) {
	switch v := e.(type) {
	case *ast.BasicLit:
		if v.Kind != token.STRING {
			return v.Value, v.Kind == token.INT || v.Kind == token.FLOAT
		}
		s, err := strconv.Unquote(v.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := consts[v.Name]
		return s, ok
	case *ast.BinaryExpr:
		if v.Op != token.ADD {
			return "", false
		}
		a, ok1 := literal(v.X, consts)
		b, ok2 := literal(v.Y, consts)
		return a + b, ok1 && ok2
	}
	return "", false
}

// metricOpts are the prometheus option types that name a metric, with the
// series suffixes they add.
var metricOpts = map[string][]string{
	"CounterOpts":   {""},
	"GaugeOpts":     {""},
	"HistogramOpts": {"_bucket", "_sum", "_count", ""},
	"SummaryOpts":   {"_sum", "_count", ""},
	"Opts":          {""},
}

func metricsOf(f *ast.File, consts map[string]string, code *Code) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch v := n.(type) {
		case *ast.CompositeLit:
			sel, ok := v.Type.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			suffixes, ok := metricOpts[sel.Sel.Name]
			if !ok || !isIdent(sel.X, "prometheus") {
				return true
			}
			var ns, sub, name string
			for _, el := range v.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				key, _ := kv.Key.(*ast.Ident)
				if key == nil {
					continue
				}
				s, _ := literal(kv.Value, consts)
				switch key.Name {
				case "Namespace":
					ns = s
				case "Subsystem":
					sub = s
				case "Name":
					name = s
				}
			}
			if name == "" {
				return true
			}
			full := joinName(ns, sub, name)
			for _, s := range suffixes {
				code.Metrics[full+s] = true
			}
		case *ast.CallExpr:
			sel, ok := v.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			switch {
			case isIdent(sel.X, "prometheus") && sel.Sel.Name == "NewDesc" && len(v.Args) > 0:
				if s, ok := literal(v.Args[0], consts); ok {
					code.Metrics[s] = true
				}
			case isIdent(sel.X, "prometheus") && sel.Sel.Name == "BuildFQName" && len(v.Args) == 3:
				a, ok1 := literal(v.Args[0], consts)
				b, ok2 := literal(v.Args[1], consts)
				c, ok3 := literal(v.Args[2], consts)
				if ok1 && ok2 && ok3 {
					code.Metrics[joinName(a, b, c)] = true
				}
			case isIdent(sel.X, "collectors") && sel.Sel.Name == "NewGoCollector":
				code.MetricPrefixes = appendOnce(code.MetricPrefixes, "go_")
			case isIdent(sel.X, "collectors") && sel.Sel.Name == "NewProcessCollector":
				code.MetricPrefixes = appendOnce(code.MetricPrefixes, "process_")
			}
		}
		return true
	})
}

func joinName(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "_")
}

func appendOnce(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// flagMethods maps flag.FlagSet (and package flag) definers to the index
// of their name argument.
var flagMethods = map[string]int{
	"String": 0, "Bool": 0, "Int": 0, "Int64": 0, "Uint": 0, "Uint64": 0,
	"Float64": 0, "Duration": 0, "Func": 0, "BoolFunc": 0,
	"StringVar": 1, "BoolVar": 1, "IntVar": 1, "Int64Var": 1, "UintVar": 1,
	"Uint64Var": 1, "Float64Var": 1, "DurationVar": 1, "Var": 1, "TextVar": 1,
}

func flagsOf(f *ast.File, consts map[string]string, out map[string]string) {
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		i, ok := flagMethods[sel.Sel.Name]
		if !ok || len(call.Args) < i+2 {
			return true
		}
		name, ok := literal(call.Args[i], consts)
		if !ok || !validFlagName(name) {
			return true
		}
		def := ""
		switch sel.Sel.Name {
		case "Func", "BoolFunc", "Var", "TextVar":
		default:
			if s, ok := literal(call.Args[i+1], consts); ok {
				def = s
			}
		}
		if _, seen := out[name]; !seen || def != "" {
			out[name] = def
		}
		return true
	})
}

func validFlagName(s string) bool {
	if s == "" || len(s) > 64 || strings.HasPrefix(s, "-") {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func pathsOf(f *ast.File, out map[string]bool) {
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		s, err := strconv.Unquote(lit.Value)
		if err == nil && strings.HasPrefix(s, "/") && len(s) < 256 {
			// "GET /readyz" style patterns register the path too.
			out[s] = true
		}
		if err == nil {
			if _, p, ok := strings.Cut(s, " /"); ok && !strings.Contains(p, " ") {
				out["/"+p] = true
			}
		}
		return true
	})
}
