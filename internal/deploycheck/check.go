package deploycheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/quotacoord/quota/internal/operatortoken"
	"github.com/quotacoord/quota/internal/policy"
)

// ImagePrefix is the repository prefix of the project's images; the rest
// of the name is the command: ImagePrefix + "regional" runs cmd/regional
// (deploy/docker/Dockerfile builds them).
const ImagePrefix = "ghcr.io/quotacoord/quota-"

// ThirdPartyImages are the other images deploy/ may use, by repository.
var ThirdPartyImages = map[string]bool{
	"redis":                  true,
	"quay.io/coreos/etcd":    true,
	"envoyproxy/envoy":       true,
	"prom/prometheus":        true,
	"grafana/grafana":        true,
	"gcr.io/distroless/base": true,
}

// Limits on what Load reads.
const (
	maxFiles    = 1000
	maxFileSize = 4 << 20
	maxDocs     = 256
)

// File is one YAML or JSON file under deploy/.
type File struct {
	// Path is relative to the module root, with slashes.
	Path string
	Raw  []byte
	// Docs are the decoded documents (one for JSON; every "---" part of a
	// YAML stream, empty ones dropped).
	Docs []any
}

// Problem is one inconsistency between deploy/ and the code.
type Problem struct {
	Path string
	What string
}

func (p Problem) String() string { return p.Path + ": " + p.What }

// Load reads every *.yaml, *.yml and *.json file under root/deploy.
func Load(root string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		ext := strings.ToLower(filepath.Ext(p))
		if d.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			return nil
		}
		if len(files) >= maxFiles {
			return fmt.Errorf("more than %d files", maxFiles)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Size() > maxFileSize {
			return fmt.Errorf("%s: %d bytes, more than %d", p, info.Size(), maxFileSize)
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		f, err := Decode(filepath.ToSlash(rel), raw)
		if err != nil {
			return err
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("deploycheck: load deploy/: %w", err)
	}
	return files, nil
}

// Decode parses one file's bytes by its extension.
func Decode(path string, raw []byte) (File, error) {
	f := File{Path: path, Raw: raw}
	if strings.HasSuffix(path, ".json") {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return f, fmt.Errorf("%s: %w", path, err)
		}
		f.Docs = []any{v}
		return f, nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return f, fmt.Errorf("%s: %w", path, err)
		}
		if v == nil {
			continue
		}
		if len(f.Docs) >= maxDocs {
			return f, fmt.Errorf("%s: more than %d documents", path, maxDocs)
		}
		f.Docs = append(f.Docs, v)
	}
	return f, nil
}

// workload is a pod template found in a manifest.
type workload struct {
	path       string
	name       string
	labels     map[string]any
	containers []any // initContainers, then containers
	inits      int
}

type checker struct {
	root     string
	code     Code
	files    []File
	problems []Problem
	loads    map[string]bool // paths present (files, and directories holding them)
	work     []workload
	policies map[string]*policy.Set // by file path
}

// Check returns every inconsistency between files and code, sorted. root
// is the module root, for kustomize references to files that are not
// YAML.
func Check(root string, code Code, files []File) []Problem {
	c := &checker{root: root, code: code, files: files, loads: map[string]bool{}, policies: map[string]*policy.Set{}}
	for _, f := range files {
		c.loads[f.Path] = true
		for d := path.Dir(f.Path); d != "." && d != "/"; d = path.Dir(d) {
			c.loads[d] = true
		}
	}
	// First pass: collect workloads and policy sets.
	for _, f := range files {
		for _, d := range f.Docs {
			m, _ := d.(map[string]any)
			if m == nil {
				continue
			}
			if w, ok := podTemplate(m); ok {
				w.path = f.Path
				c.work = append(c.work, w)
			}
		}
		if len(f.Docs) == 1 && isPolicyFile(f.Docs[0]) {
			set, err := policy.Parse(path.Base(f.Path), f.Raw)
			if err != nil {
				c.add(f.Path, "policy file does not load: %v", err)
				continue
			}
			c.policies[f.Path] = set
		}
	}
	for _, w := range c.work {
		for i, ct := range w.containers {
			c.container(w, i, asMap(ct))
		}
	}
	var records []string
	for _, f := range files {
		for _, d := range f.Docs {
			if m := asMap(d); m != nil {
				records = append(records, recordNames(m)...)
			}
		}
	}
	for _, f := range files {
		for _, d := range f.Docs {
			m := asMap(d)
			if m == nil {
				continue
			}
			switch {
			case path.Base(f.Path) == "kustomization.yaml" || path.Base(f.Path) == "kustomization.yml":
				c.kustomization(f.Path, m)
			case str(m, "kind") == "Service":
				c.service(f.Path, m)
			case str(m, "kind") == "PodDisruptionBudget":
				c.pdb(f.Path, m)
			case m["static_resources"] != nil:
				c.envoy(f.Path, m)
			case m["groups"] != nil:
				c.rules(f.Path, m, records)
			case m["panels"] != nil:
				c.dashboard(f.Path, m)
			}
		}
	}
	sort.Slice(c.problems, func(i, j int) bool {
		if c.problems[i].Path != c.problems[j].Path {
			return c.problems[i].Path < c.problems[j].Path
		}
		return c.problems[i].What < c.problems[j].What
	})
	return c.problems
}

func (c *checker) add(p, format string, args ...any) {
	c.problems = append(c.problems, Problem{Path: p, What: fmt.Sprintf(format, args...)})
}

func isPolicyFile(d any) bool {
	m := asMap(d)
	if m == nil || m["kind"] != nil || m["apiVersion"] != nil {
		return false
	}
	_, own := m["policies"]
	_, envoy := m["domain"]
	return own || envoy
}

func podTemplate(m map[string]any) (workload, bool) {
	switch str(m, "kind") {
	case "Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet":
	default:
		return workload{}, false
	}
	tpl := asMap(dig(m, "spec", "template"))
	spec := asMap(tpl["spec"])
	if spec == nil {
		return workload{}, false
	}
	w := workload{
		name:   str(asMap(m["metadata"]), "name"),
		labels: asMap(dig(tpl, "metadata", "labels")),
	}
	w.containers = append(w.containers, asList(spec["initContainers"])...)
	w.inits = len(w.containers)
	w.containers = append(w.containers, asList(spec["containers"])...)
	return w, true
}

// container checks one container of a workload.
func (c *checker) container(w workload, i int, ct map[string]any) {
	where := fmt.Sprintf("%s %s container %q", w.path, w.name, str(ct, "name"))
	image := str(ct, "image")
	cmd, ours, ok := c.image(image)
	if !ok {
		c.add(w.path, "%s: image %q is neither %s<cmd>:<tag> for a cmd/ directory nor a pinned image in ThirdPartyImages", where, image, ImagePrefix)
		return
	}
	ports := declaredPorts(ct)
	if ours {
		c.args(w.path, where, cmd, asList(ct["args"]), ports, true)
	}
	for _, probe := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
		hg := asMap(dig(ct, probe, "httpGet"))
		if hg == nil {
			continue
		}
		if !ports.has(hg["port"]) {
			c.add(w.path, "%s: %s port %v is not a declared container port", where, probe, hg["port"])
		}
		if p := str(hg, "path"); ours && !c.code.Commands[cmd].Paths[p] {
			c.add(w.path, "%s: %s path %q is not served by cmd/%s", where, probe, p, cmd)
		}
	}
}

// image says which command an image runs (ours) or whether it is an
// allowed third-party image.
func (c *checker) image(image string) (cmd string, ours, ok bool) {
	repo, tag, hasTag := strings.Cut(image, ":")
	if at := strings.IndexByte(image, '@'); at > 0 {
		repo, tag, hasTag = image[:at], image[at+1:], true
	}
	if !hasTag || tag == "" || tag == "latest" {
		return "", false, false
	}
	if name, mine := strings.CutPrefix(repo, ImagePrefix); mine {
		_, known := c.code.Commands[name]
		return name, true, known
	}
	return "", false, ThirdPartyImages[repo]
}

type portSet struct {
	names   map[string]bool
	numbers map[int]bool
}

func (p portSet) has(v any) bool {
	switch x := v.(type) {
	case string:
		if n, err := strconv.Atoi(x); err == nil {
			return p.numbers[n]
		}
		return p.names[x]
	case int:
		return p.numbers[x]
	case float64:
		return p.numbers[int(x)]
	}
	return false
}

func declaredPorts(ct map[string]any) portSet {
	p := portSet{names: map[string]bool{}, numbers: map[int]bool{}}
	for _, x := range asList(ct["ports"]) {
		m := asMap(x)
		if n := str(m, "name"); n != "" {
			p.names[n] = true
		}
		if n, ok := toInt(m["containerPort"]); ok {
			p.numbers[n] = true
		}
	}
	return p
}

var argRE = regexp.MustCompile(`^--?([A-Za-z0-9][A-Za-z0-9_.-]*)(=(.*))?$`)

// args checks a command line of cmd against its flags and, when
// checkPorts, the container's declared ports.
func (c *checker) args(file, where, cmd string, args []any, ports portSet, checkPorts bool) {
	flags := c.code.Commands[cmd].Flags
	served := map[int]bool{}
	given := map[string]bool{}
	for _, a := range args {
		s, ok := a.(string)
		if !ok {
			c.add(file, "%s: argument %v is not a string", where, a)
			continue
		}
		m := argRE.FindStringSubmatch(s)
		if m == nil {
			if strings.HasPrefix(s, "-") {
				c.add(file, "%s: argument %q is not -flag or -flag=value", where, s)
			}
			continue
		}
		name := m[1]
		given[name] = true
		if _, ok := flags[name]; !ok {
			c.add(file, "%s: flag -%s is not defined by cmd/%s", where, name, cmd)
			continue
		}
		// A loopback address serves no container port.
		if strings.HasSuffix(name, "-addr") && m[2] != "" && !operatortoken.LoopbackAddr(m[3]) {
			if n, ok := addrPort(m[3]); ok {
				served[n] = true
				if checkPorts && !ports.numbers[n] {
					c.add(file, "%s: -%s listens on port %d, which is not a declared container port", where, name, n)
				}
			}
		}
	}
	if !checkPorts {
		return
	}
	for name, def := range flags {
		if strings.HasSuffix(name, "-addr") && !given[name] && !operatortoken.LoopbackAddr(def) {
			if n, ok := addrPort(def); ok {
				served[n] = true
			}
		}
	}
	nums := make([]int, 0, len(ports.numbers))
	for n := range ports.numbers {
		nums = append(nums, n)
	}
	sort.Ints(nums)
	for _, n := range nums {
		if !served[n] {
			c.add(file, "%s: container port %d is not where any -*-addr flag of cmd/%s listens", where, n, cmd)
		}
	}
}

func addrPort(addr string) (int, bool) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(p)
	return n, err == nil && n > 0 && n < 65536
}

// matching returns the workloads whose pod labels include selector.
func (c *checker) matching(selector map[string]any) []workload {
	var out []workload
	for _, w := range c.work {
		ok := len(selector) > 0
		for k, v := range selector {
			if fmt.Sprint(w.labels[k]) != fmt.Sprint(v) {
				ok = false
			}
		}
		if ok {
			out = append(out, w)
		}
	}
	return out
}

func (c *checker) service(file string, m map[string]any) {
	spec := asMap(m["spec"])
	name := str(asMap(m["metadata"]), "name")
	sel := asMap(spec["selector"])
	if sel == nil {
		return // operator-provided endpoints or ExternalName
	}
	ws := c.matching(sel)
	if len(ws) == 0 {
		c.add(file, "Service %s: selector %v matches no pod template in deploy/", name, sel)
		return
	}
	for _, p := range asList(spec["ports"]) {
		pm := asMap(p)
		target := pm["targetPort"]
		if target == nil {
			target = pm["port"]
		}
		found := false
		for _, w := range ws {
			for _, ct := range w.containers {
				if declaredPorts(asMap(ct)).has(target) {
					found = true
				}
			}
		}
		if !found {
			c.add(file, "Service %s: targetPort %v is not declared by the selected containers", name, target)
		}
	}
}

func (c *checker) pdb(file string, m map[string]any) {
	sel := asMap(dig(m, "spec", "selector", "matchLabels"))
	if len(c.matching(sel)) == 0 {
		c.add(file, "PodDisruptionBudget %s: selector %v matches no pod template in deploy/", str(asMap(m["metadata"]), "name"), sel)
	}
}

var argsPathRE = regexp.MustCompile(`^/spec/template/spec/containers/(\d+)/args$`)

func (c *checker) kustomization(file string, m map[string]any) {
	dir := path.Dir(file)
	exists := func(ref string) bool {
		p := path.Clean(path.Join(dir, ref))
		if c.loads[p] {
			return true
		}
		_, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(p)))
		return err == nil
	}
	var refs []string
	for _, key := range []string{"resources", "components", "patchesStrategicMerge", "crds"} {
		for _, r := range asList(m[key]) {
			if s, ok := r.(string); ok {
				refs = append(refs, s)
			}
		}
	}
	for _, g := range append(asList(m["configMapGenerator"]), asList(m["secretGenerator"])...) {
		for _, x := range append(asList(asMap(g)["files"]), asList(asMap(g)["envs"])...) {
			s, _ := x.(string)
			if _, after, ok := strings.Cut(s, "="); ok {
				s = after
			}
			refs = append(refs, s)
		}
	}
	for _, r := range refs {
		if strings.Contains(r, "://") {
			c.add(file, "reference %q is remote; deploy/ must be self-contained", r)
			continue
		}
		if !exists(r) {
			c.add(file, "reference %q does not exist", r)
		}
	}
	for _, p := range asList(m["patches"]) {
		pm := asMap(p)
		ref := str(pm, "path")
		if ref == "" {
			continue
		}
		if !exists(ref) {
			c.add(file, "patch %q does not exist", ref)
			continue
		}
		target := asMap(pm["target"])
		c.argsPatch(file, path.Clean(path.Join(dir, ref)), str(target, "name"))
	}
}

// argsPatch checks a JSON patch that replaces a container's args of the
// workload named target.
func (c *checker) argsPatch(kfile, patchPath, target string) {
	for _, f := range c.files {
		if f.Path != patchPath || len(f.Docs) != 1 {
			continue
		}
		for _, op := range asList(f.Docs[0]) {
			om := asMap(op)
			mm := argsPathRE.FindStringSubmatch(str(om, "path"))
			if mm == nil {
				continue
			}
			idx, _ := strconv.Atoi(mm[1])
			checked := false
			for _, w := range c.work {
				if target != "" && w.name != target {
					continue
				}
				// The path indexes regular containers only.
				if w.inits+idx >= len(w.containers) {
					continue
				}
				ct := asMap(w.containers[w.inits+idx])
				cmd, ours, ok := c.image(str(ct, "image"))
				if !ok || !ours {
					continue
				}
				checked = true
				where := fmt.Sprintf("%s patch of %s container %q", f.Path, w.name, str(ct, "name"))
				c.args(f.Path, where, cmd, asList(om["value"]), declaredPorts(ct), true)
			}
			if !checked {
				c.add(kfile, "patch %s replaces args of %q, which names no container of ours in deploy/", patchPath, target)
			}
		}
	}
}

func (c *checker) rules(file string, m map[string]any, records []string) {
	known := map[string]bool{}
	for _, r := range records {
		known[r] = true
	}
	for _, g := range asList(m["groups"]) {
		for _, r := range asList(asMap(g)["rules"]) {
			rm := asMap(r)
			name := str(rm, "alert")
			if name == "" {
				name = str(rm, "record")
			}
			c.exprMetrics(file, "rule "+name, str(rm, "expr"), known)
		}
	}
}

func recordNames(m map[string]any) []string {
	var out []string
	for _, g := range asList(m["groups"]) {
		for _, r := range asList(asMap(g)["rules"]) {
			if n := str(asMap(r), "record"); n != "" {
				out = append(out, n)
			}
		}
	}
	return out
}

func (c *checker) exprMetrics(file, where, expr string, extra map[string]bool) {
	if strings.TrimSpace(expr) == "" {
		c.add(file, "%s: empty expression", where)
		return
	}
	names, err := Metrics(expr)
	if err != nil {
		c.add(file, "%s: %v", where, err)
		return
	}
	if len(names) == 0 {
		c.add(file, "%s: expression %q reads no metric", where, expr)
	}
	for _, n := range names {
		if !c.code.HasMetric(n) && !extra[n] {
			c.add(file, "%s: metric %s is not registered by the code", where, n)
		}
	}
}

func (c *checker) dashboard(file string, m map[string]any) {
	var walk func(panels []any)
	walk = func(panels []any) {
		for _, p := range panels {
			pm := asMap(p)
			for _, t := range asList(pm["targets"]) {
				c.exprMetrics(file, fmt.Sprintf("panel %q", str(pm, "title")), str(asMap(t), "expr"), nil)
			}
			walk(asList(pm["panels"]))
		}
	}
	walk(asList(m["panels"]))
	for _, v := range asList(dig(m, "templating", "list")) {
		vm := asMap(v)
		if str(vm, "type") != "query" {
			continue
		}
		q := str(vm, "query")
		if q == "" {
			q = str(asMap(vm["query"]), "query")
		}
		c.exprMetrics(file, fmt.Sprintf("variable %q", str(vm, "name")), q, nil)
	}
}

// envoy checks an Envoy bootstrap's rate limit filter and routes.
func (c *checker) envoy(file string, m map[string]any) {
	clusters := map[string]map[string]any{}
	for _, cl := range asList(dig(m, "static_resources", "clusters")) {
		cm := asMap(cl)
		clusters[str(cm, "name")] = cm
	}
	var domain string
	found, deny := false, false
	var routes []map[string]any
	var visit func(v any)
	visit = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if str(x, "name") == quotaFilterName {
				c.quotaFilter(file, x, clusters)
			}
			if str(x, "name") == "envoy.filters.http.ratelimit" {
				found = true
				tc := asMap(x["typed_config"])
				domain = str(tc, "domain")
				deny, _ = tc["failure_mode_deny"].(bool)
				cl := str(asMap(dig(tc, "rate_limit_service", "grpc_service", "envoy_grpc")), "cluster_name")
				c.rlsCluster(file, cl, clusters[cl])
			}
			if rl := asList(asMap(x["route"])["rate_limits"]); rl != nil {
				routes = append(routes, x)
			}
			for _, y := range x {
				visit(y)
			}
		case []any:
			for _, y := range x {
				visit(y)
			}
		}
	}
	visit(m)
	if !found {
		return
	}
	if len(routes) > 0 && !deny {
		c.add(file, "rate limit filter protects routes without failure_mode_deny: true: Envoy admits every request whose rate limit call fails (see docs/security.md)")
	}
	set := c.domainSet(domain)
	if set == nil {
		c.add(file, "rate limit domain %q is served by no policy file in deploy/", domain)
		return
	}
	for _, r := range routes {
		for _, rl := range asList(asMap(r["route"])["rate_limits"]) {
			var entries []policy.Entry
			for _, a := range asList(asMap(rl)["actions"]) {
				am := asMap(a)
				switch {
				case am["generic_key"] != nil:
					gk := asMap(am["generic_key"])
					k := str(gk, "descriptor_key")
					if k == "" {
						k = "generic_key"
					}
					entries = append(entries, policy.Entry{Key: k, Value: str(gk, "descriptor_value")})
				case am["request_headers"] != nil:
					entries = append(entries, policy.Entry{Key: str(asMap(am["request_headers"]), "descriptor_key"), Value: "example"})
				case am["remote_address"] != nil:
					entries = append(entries, policy.Entry{Key: "remote_address", Value: "192.0.2.1"})
				default:
					c.add(file, "route %v: rate limit action %v is not understood by deploycheck", dig(r, "match"), am)
				}
			}
			got, err := set.MatchDescriptors(domain, [][]policy.Entry{entries})
			if err != nil {
				c.add(file, "route %v: descriptor %v: %v", dig(r, "match"), entries, err)
				continue
			}
			if len(got) != 1 || (got[0].Policy == nil && !got[0].Unlimited) {
				c.add(file, "route %v: descriptor %v matches no rule of domain %q", dig(r, "match"), entries, domain)
			}
		}
	}
}

// domainSet returns the policy set that serves an Envoy domain, nil if none.
func (c *checker) domainSet(domain string) *policy.Set {
	var set *policy.Set
	for _, s := range c.policies {
		for _, d := range s.Domains() {
			if d == domain {
				set = s
			}
		}
	}
	return set
}

func (c *checker) rlsCluster(file, name string, cl map[string]any) {
	if cl == nil {
		c.add(file, "rate_limit_service cluster %q is not defined", name)
		return
	}
	def := c.code.Commands["regional"].Flags["grpc-addr"]
	want, ok := addrPort(def)
	if !ok {
		c.add(file, "cmd/regional has no -grpc-addr flag with a literal default port")
		return
	}
	var visit func(v any)
	ports := 0
	visit = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if sa := asMap(x["socket_address"]); sa != nil {
				ports++
				if n, _ := toInt(sa["port_value"]); n != want {
					c.add(file, "cluster %q: port %v is not the regional node's gRPC port %d", name, sa["port_value"], want)
				}
			}
			for _, y := range x {
				visit(y)
			}
		case []any:
			for _, y := range x {
				visit(y)
			}
		}
	}
	visit(cl["load_assignment"])
	if ports == 0 {
		c.add(file, "cluster %q has no endpoint", name)
	}
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func asList(v any) []any         { l, _ := v.([]any); return l }

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func dig(v any, keys ...string) any {
	for _, k := range keys {
		m := asMap(v)
		if m == nil {
			return nil
		}
		v = m[k]
	}
	return v
}

func toInt(v any) (int, bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case float64:
		return int(x), x == float64(int(x))
	case string:
		n, err := strconv.Atoi(x)
		return n, err == nil
	}
	return 0, false
}
