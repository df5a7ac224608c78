package importgraph

import (
	"go/types"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// TestPublicAPIHasNoInternalTypes walks the exported API of every package
// outside internal/ and cmd/ (exported names, their types, exported fields
// and methods, through pointers, slices, maps, signatures and aliases) and
// fails when one mentions a type of an internal package: a user outside
// the module could not name it.
func TestPublicAPIHasNoInternalTypes(t *testing.T) {
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes | packages.NeedImports | packages.NeedDeps}
	pkgs, err := packages.Load(cfg, module+"/...")
	if err != nil {
		t.Fatalf("load packages: %v", err)
	}
	public := 0
	for _, p := range pkgs {
		if strings.Contains(p.PkgPath, "/internal/") || strings.Contains(p.PkgPath, "/cmd/") || strings.Contains(p.PkgPath, "/examples/") {
			continue
		}
		if len(p.Errors) > 0 {
			t.Fatalf("%s: %v", p.PkgPath, p.Errors)
		}
		public++
		for _, name := range p.Types.Scope().Names() {
			obj := p.Types.Scope().Lookup(name)
			if !obj.Exported() {
				continue
			}
			if bad := internalTypes(p.PkgPath, obj.Type()); len(bad) > 0 {
				t.Errorf("%s.%s mentions %s", p.PkgPath, name, strings.Join(bad, ", "))
			}
		}
	}
	if public < 5 {
		t.Fatalf("only %d public packages found", public)
	}
}

// internalTypes lists the internal named types t's exported surface
// mentions; types of other public packages are not followed (their own
// walk checks them).
func internalTypes(pkg string, t types.Type) []string {
	var bad []string
	seen := map[types.Type]bool{}
	var walk func(types.Type)
	walk = func(t types.Type) {
		if seen[t] {
			return
		}
		seen[t] = true
		switch t := t.(type) {
		case *types.Alias:
			walk(types.Unalias(t))
		case *types.Named:
			p := t.Obj().Pkg()
			if p == nil {
				return
			}
			if strings.Contains(p.Path(), "/internal/") {
				if n := p.Path() + "." + t.Obj().Name(); !slices.Contains(bad, n) {
					bad = append(bad, n)
				}
				return
			}
			if p.Path() != pkg {
				return
			}
			walk(t.Underlying())
			for i := range t.NumMethods() {
				if m := t.Method(i); m.Exported() {
					walk(m.Type())
				}
			}
		case *types.Pointer:
			walk(t.Elem())
		case *types.Slice:
			walk(t.Elem())
		case *types.Array:
			walk(t.Elem())
		case *types.Chan:
			walk(t.Elem())
		case *types.Map:
			walk(t.Key())
			walk(t.Elem())
		case *types.Signature:
			for v := range t.Params().Variables() {
				walk(v.Type())
			}
			for v := range t.Results().Variables() {
				walk(v.Type())
			}
		case *types.Struct:
			for i := range t.NumFields() {
				if f := t.Field(i); f.Exported() {
					walk(f.Type())
				}
			}
		case *types.Interface:
			for i := range t.NumMethods() {
				walk(t.Method(i).Type())
			}
		}
	}
	walk(t)
	return bad
}
