package quotav1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedCodeIsFresh regenerates every .proto with scripts/proto.sh
// into a temporary directory and fails when the committed code differs:
// run `make proto` after editing a .proto file.
func TestGeneratedCodeIsFresh(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "scripts", "proto.sh"))
	cmd.Env = append(os.Environ(), "PROTO_OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/proto.sh: %v\n%s", err, b)
	}
	generated, err := filepath.Glob(filepath.Join(out, "quota", "v1", "*.go"))
	if err != nil || len(generated) == 0 {
		t.Fatalf("no generated files in %s (err %v)", out, err)
	}
	committed, _ := filepath.Glob("*.pb.go")
	if len(committed) != len(generated) {
		t.Errorf("committed %d generated files, regeneration gives %d: run make proto", len(committed), len(generated))
	}
	for _, g := range generated {
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(g)
		got, err := os.ReadFile(name)
		if err != nil {
			t.Errorf("%s is not committed: run make proto", name)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run make proto (first differing line: %s)", name, firstDiff(got, want))
		}
	}
}

func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			return al[i]
		}
	}
	return "(length differs)"
}
