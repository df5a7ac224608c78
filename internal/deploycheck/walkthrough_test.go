package deploycheck

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// dirSandbox is a copy of the module's deploy/ tree in a temporary
// directory, rendered with the real kubectl.
type dirSandbox struct {
	root    string
	kubectl string
}

// newSandbox copies root/deploy into a fresh directory. Without kubectl
// the test fails: a walk-through nobody rendered must not pass.
func newSandbox(t *testing.T, root string) *dirSandbox {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl not installed: the walk-through cannot be rendered; run scripts/deps.sh (apt-get install kubernetes-client)")
	}
	sb := &dirSandbox{root: t.TempDir(), kubectl: kubectl}
	if err := os.CopyFS(filepath.Join(sb.root, "deploy"), os.DirFS(filepath.Join(root, "deploy"))); err != nil {
		t.Fatal(err)
	}
	return sb
}

// inside maps a relative, slash-separated path into the sandbox, refusing
// one that leaves it.
func (sb *dirSandbox) inside(p string) (string, error) {
	clean := filepath.Clean(filepath.FromSlash(p))
	if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("path %q leaves the repository", p)
	}
	return filepath.Join(sb.root, clean), nil
}

// renders caches kubectl's output by directory and the sandbox's whole
// tree: the cases of TestWalkthroughFindsRot render the same trees again.
var renders sync.Map // string → []byte

func (sb *dirSandbox) Render(dir string) ([]byte, error) {
	d, err := sb.inside(dir)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", dir)
	err = filepath.WalkDir(sb.root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		fmt.Fprintf(h, "%s\x00%d\x00", strings.TrimPrefix(p, sb.root), len(b))
		h.Write(b)
		return err
	})
	if err != nil {
		return nil, err
	}
	key := string(h.Sum(nil))
	if out, ok := renders.Load(key); ok {
		return out.([]byte), nil
	}
	out, err := exec.Command(sb.kubectl, "kustomize", d).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, out)
	}
	renders.Store(key, out)
	return out, nil
}

func (sb *dirSandbox) CopyDir(src, dst string) error {
	s, err := sb.inside(src)
	if err != nil {
		return err
	}
	d, err := sb.inside(dst)
	if err != nil {
		return err
	}
	if _, err := os.Stat(d); err == nil {
		return fmt.Errorf("%s exists already (cp -r would copy into it)", dst)
	}
	return os.CopyFS(d, os.DirFS(s))
}

func (sb *dirSandbox) WriteFile(file string, data []byte) error {
	f, err := sb.inside(file)
	if err != nil {
		return err
	}
	return os.WriteFile(f, data, 0o644)
}

func (sb *dirSandbox) Exists(p string) bool {
	f, err := sb.inside(p)
	if err != nil {
		return false
	}
	_, err = os.Stat(f)
	return err == nil
}

// readmeSteps reads the commands of deploy/README.md.
func readmeSteps(t *testing.T, root string) []Step {
	t.Helper()
	md, err := os.ReadFile(filepath.Join(root, "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	steps, err := Steps(md)
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

// TestWalkthrough replays deploy/README.md's walk-through, from an empty
// cluster to a checked request and a new region, against what kubectl
// kustomize renders: every directory it applies builds, every object it
// waits for, forwards or reads is in those renderings, the request it
// checks names a policy they hold.
func TestWalkthrough(t *testing.T) {
	root, code := repo(t)
	steps := readmeSteps(t, root)
	applies := 0
	for _, s := range steps {
		if len(s.Words) > 1 && s.Words[0] == "kubectl" && s.Words[1] == "apply" {
			applies++
		}
	}
	if applies < 4 {
		t.Fatalf("the walk-through applies %d kustomizations, want the trial, the coordinator and two regions", applies)
	}
	for _, p := range CheckWalkthrough(root, "deploy/README.md", code, steps, newSandbox(t, root)) {
		t.Error(p)
	}
}

// TestWalkthroughFindsRot edits the committed walk-through in one place
// at a time and expects the check to name what broke.
func TestWalkthroughFindsRot(t *testing.T) {
	root, code := repo(t)
	md, err := os.ReadFile(filepath.Join(root, "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		from, to string // in deploy/README.md, once
		want     string
	}{
		{"missing overlay", "apply -k deploy/kubernetes/overlays/us-east", "apply -k deploy/kubernetes/overlays/mars", "holds no kustomization.yaml"},
		{"wrong port", "svc/quota-regional 8081", "svc/quota-regional 9999", "has no port 9999"},
		{"unknown service", "svc/quota-regional", "svc/quota-node", "no applied Service quota-node"},
		{"wrong namespace", "-n quota-try rollout status deployment/quota-regional", "-n quota rollout status deployment/quota-regional", "no applied deployment quota-regional in namespace quota"},
		{"unknown policy", "-policy exports", "-policy exports-v2", `policy "exports-v2"`},
		{"unread secret", "secret generic quota-operator-tokens", "secret generic quota-tokens", "reads secret quota-tokens"},
		{"unknown flag", "-subject tenant-a", "-tenant tenant-a", "has no flag -tenant"},
		{"port not forwarded", "-addr 127.0.0.1:8081", "-addr 127.0.0.1:8082", "no port-forward listens on 8082"},
		{"image not built", "docker build -f deploy/docker/Dockerfile --build-arg CMD=coordinator -t ghcr.io/quotacoord/quota-coordinator:v0.1.0 .\n", "", "was not built before"},
		{"region file without its name", "printf 'REGION=sa-east\\n", "printf '", "kubectl kustomize deploy/kubernetes/overlays/sa-east"},
		{"unknown command", "cp -r", "rsync -r", `command "rsync"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if n := strings.Count(string(md), tc.from); n != 1 {
				t.Fatalf("%q is in deploy/README.md %d times, want once", tc.from, n)
			}
			steps, err := Steps([]byte(strings.Replace(string(md), tc.from, tc.to, 1)))
			if err != nil {
				t.Fatal(err)
			}
			problems := CheckWalkthrough(root, "deploy/README.md", code, steps, newSandbox(t, root))
			for _, p := range problems {
				if strings.Contains(p.String(), tc.want) {
					return
				}
			}
			t.Errorf("no problem says %q; got %v", tc.want, problems)
		})
	}
}

func TestSteps(t *testing.T) {
	md := "text `kubectl` here\n\n```sh\n# a comment\nkubectl apply -k a \\\n    -n b\n\nkubectl -n x port-forward svc/y 1 &\necho \"a b\" 'c d'$(e f)\n```\n\n```yaml\nnot: a command\n```\n"
	steps, err := Steps([]byte(md))
	if err != nil {
		t.Fatal(err)
	}
	want := []Step{
		{Line: 5, Words: []string{"kubectl", "apply", "-k", "a", "-n", "b"}},
		{Line: 8, Words: []string{"kubectl", "-n", "x", "port-forward", "svc/y", "1"}},
		{Line: 9, Words: []string{"echo", "a b", "c d$(e", "f)"}},
	}
	if !reflect.DeepEqual(steps, want) {
		t.Errorf("Steps = %q\nwant %q", steps, want)
	}
	for _, bad := range []string{"```sh\necho 'open\n```\n", "```sh\necho a \\\n```\n", "```sh\necho a\n"} {
		if _, err := Steps([]byte(bad)); err == nil {
			t.Errorf("Steps(%q) = nil error", bad)
		}
	}
	if _, err := Steps([]byte("```sh\n" + strings.Repeat("true\n", maxSteps+1) + "```\n")); err == nil || errors.Is(err, nil) {
		t.Errorf("more than %d commands: %v", maxSteps, err)
	}
}

// TestRegionOverlaysAreOneFile: every region overlay is the same
// kustomization.yaml and a region.env naming its own directory with
// exactly the keys the region component reads, so that a copy and a new
// region.env make a region (as deploy/README.md says).
func TestRegionOverlaysAreOneFile(t *testing.T) {
	root, _ := repo(t)
	envs, err := filepath.Glob(filepath.Join(root, "deploy", "kubernetes", "overlays", "*", "region.env"))
	if err != nil || len(envs) < 3 {
		t.Fatalf("region overlays: %v, %v", envs, err)
	}
	var first []byte
	for _, env := range append(envs, filepath.Join(root, "deploy", "try", "region.env")) {
		dir := filepath.Dir(env)
		b, err := os.ReadFile(env)
		if err != nil {
			t.Fatal(err)
		}
		keys := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			k, v, ok := strings.Cut(line, "=")
			if !ok || v == "" || keys[k] != "" {
				t.Errorf("%s: line %q is not a new KEY=VALUE", env, line)
			}
			keys[k] = v
		}
		if len(keys) != 3 || keys["REGION"] == "" || keys["REDIS"] == "" || keys["ETCD"] == "" {
			t.Errorf("%s: keys %v, want REGION, REDIS and ETCD", env, keys)
		}
		if filepath.Base(filepath.Dir(dir)) != "overlays" {
			continue // deploy/try
		}
		if keys["REGION"] != filepath.Base(dir) {
			t.Errorf("%s: REGION=%s in directory %s", env, keys["REGION"], filepath.Base(dir))
		}
		k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = k
		} else if !bytes.Equal(k, first) {
			t.Errorf("%s/kustomization.yaml differs from the other regions'", dir)
		}
	}
}
