package deploycheck

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxSteps bounds the commands Steps reads from one document.
const maxSteps = 200

// Step is one command of a walk-through: a line of a ```sh block in a
// Markdown document, with continuation lines (ending in \) joined, split
// into words as a shell would (quotes removed; text inside quotes,
// $(...) included, is one word).
type Step struct {
	// Line is the 1-based line the command starts on.
	Line int
	// Words are the command's words; a trailing & is dropped.
	Words []string
}

func (s Step) String() string { return strings.Join(s.Words, " ") }

// Steps returns the commands of every ```sh block of md, in order.
// Comment lines and blank lines are skipped.
func Steps(md []byte) ([]Step, error) {
	var steps []Step
	sc := bufio.NewScanner(bytes.NewReader(md))
	inBlock, line, start := false, 0, 0
	var cmd strings.Builder
	for sc.Scan() {
		line++
		text := sc.Text()
		trimmed := strings.TrimSpace(text)
		if strings.HasPrefix(trimmed, "```") {
			if inBlock && cmd.Len() > 0 {
				return nil, fmt.Errorf("line %d: block ends inside a continued command", line)
			}
			inBlock = !inBlock && (trimmed == "```sh" || trimmed == "```bash" || trimmed == "```shell")
			continue
		}
		if !inBlock || (cmd.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#"))) {
			continue
		}
		if cmd.Len() == 0 {
			start = line
		}
		if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
			cmd.WriteString(cont + " ")
			continue
		}
		cmd.WriteString(trimmed)
		words, err := shellWords(cmd.String())
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", start, err)
		}
		if n := len(words); n > 0 && words[n-1] == "&" {
			words = words[:n-1]
		}
		if len(steps) >= maxSteps {
			return nil, fmt.Errorf("more than %d commands", maxSteps)
		}
		steps = append(steps, Step{Line: start, Words: words})
		cmd.Reset()
	}
	if inBlock {
		return nil, fmt.Errorf("unterminated code block")
	}
	return steps, sc.Err()
}

// shellWords splits s at unquoted blanks, removing single and double
// quotes; | and & stand alone when blank-separated.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			w.WriteByte(c)
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// Sandbox is where CheckWalkthrough performs a walk-through: a copy of the
// module's deploy/ tree (paths are relative to the module root, with
// slashes), so that steps that write files change the copy only.
type Sandbox interface {
	// Render returns what `kubectl kustomize dir` prints.
	Render(dir string) ([]byte, error)
	// CopyDir copies directory src to dst, as cp -r to a new dst does.
	CopyDir(src, dst string) error
	// WriteFile writes data to file.
	WriteFile(file string, data []byte) error
	// Exists reports whether p exists.
	Exists(p string) bool
}

// object is one rendered Kubernetes object a walk-through applied.
type object struct {
	dir  string // the kustomization it came from
	kind string
	ns   string // "default" when the object names none
	name string
	m    map[string]any
}

// walk is the state of a walk-through replayed step by step.
type walk struct {
	root     string
	file     string
	code     Code
	sb       Sandbox
	problems []Problem
	ns       map[string]bool   // namespaces created or applied
	applied  []object          // every object applied so far
	built    map[string]bool   // images docker build made
	loaded   map[string]bool   // images loaded into the cluster
	secrets  []Step            // kubectl create secret steps
	forwards map[string]object // local port → Service
	written  map[string]bool   // files written by redirects
}

// CheckWalkthrough replays steps (from Steps) against sb and code and
// reports every step that would not work on what the kustomizations
// render: a kustomization that does not build, a rollout or port-forward
// of an object no applied rendering holds, a Secret no applied object
// reads, a policy no applied policy file defines, an image built but not
// run (or run but not built, when the walk-through builds images), a flag
// a command does not define, a command the check does not know. file
// names the document in problems. Each applied rendering also passes
// Check (root is the module root).
func CheckWalkthrough(root, file string, code Code, steps []Step, sb Sandbox) []Problem {
	w := &walk{root: root, file: file, code: code, sb: sb, ns: map[string]bool{}, built: map[string]bool{}, loaded: map[string]bool{},
		forwards: map[string]object{}, written: map[string]bool{}}
	for _, s := range steps {
		w.step(s)
	}
	w.finish()
	return w.problems
}

func (w *walk) add(s Step, format string, args ...any) {
	w.problems = append(w.problems, Problem{Path: fmt.Sprintf("%s:%d", w.file, s.Line), What: fmt.Sprintf(format, args...)})
}

// step performs one command: its first pipeline stage, and a final
// "> FILE" redirect.
func (w *walk) step(s Step) {
	words := s.Words
	if i := indexOf(words, "|"); i >= 0 {
		words = words[:i]
	}
	if n := len(s.Words); n >= 2 && s.Words[n-2] == ">" {
		w.written[s.Words[n-1]] = true
		if indexOf(words, ">") == len(words)-2 {
			words = words[:len(words)-2]
		}
	}
	if len(words) == 0 {
		w.add(s, "empty command")
		return
	}
	switch words[0] {
	case "kind":
		w.kind(s, words[1:])
	case "docker":
		w.docker(s, words[1:])
	case "kubectl":
		w.kubectl(s, words[1:])
	case "go":
		w.goRun(s, words[1:])
	case "cp":
		if len(words) != 4 || words[1] != "-r" {
			w.add(s, "cp: want cp -r SRC DST")
			return
		}
		if err := w.sb.CopyDir(words[2], words[3]); err != nil {
			w.add(s, "cp: %v", err)
		}
	case "printf":
		w.printf(s)
	default:
		w.add(s, "command %q is not one the walk-through check knows", words[0])
	}
}

func indexOf(words []string, w string) int {
	for i, x := range words {
		if x == w {
			return i
		}
	}
	return -1
}

// kind: create cluster, and load docker-image of images built before.
func (w *walk) kind(s Step, args []string) {
	pos, _ := positional(args, map[string]bool{"name": true})
	switch {
	case len(pos) == 2 && pos[0] == "create" && pos[1] == "cluster":
	case len(pos) >= 3 && pos[0] == "load" && pos[1] == "docker-image":
		for _, img := range pos[2:] {
			if !w.built[img] {
				w.add(s, "kind load: image %s was not built before", img)
			}
			w.loaded[img] = true
		}
	default:
		w.add(s, "kind %s: not a command the check knows", strings.Join(args, " "))
	}
}

// docker build -f FILE --build-arg CMD=X -t IMAGE CONTEXT.
func (w *walk) docker(s Step, args []string) {
	pos, flags := positional(args, map[string]bool{"f": true, "build-arg": true, "t": true})
	if len(pos) != 2 || pos[0] != "build" {
		w.add(s, "docker %s: want docker build -f FILE --build-arg CMD=X -t IMAGE .", strings.Join(args, " "))
		return
	}
	if f := flags["f"]; f == "" || !w.sb.Exists(f) {
		w.add(s, "docker build: Dockerfile %q does not exist", f)
	}
	cmd, ok := strings.CutPrefix(flags["build-arg"], "CMD=")
	if _, found := w.code.Commands[cmd]; !ok || !found {
		w.add(s, "docker build: --build-arg %q names no command under cmd/", flags["build-arg"])
	}
	img := flags["t"]
	if repo, tag, _ := strings.Cut(img, ":"); repo != ImagePrefix+cmd || tag == "" || tag == "latest" {
		w.add(s, "docker build: image %q is not %s%s:TAG with a pinned tag", img, ImagePrefix, cmd)
	}
	w.built[img] = true
}

// positional splits args into positional words and flags (single or
// double dash). A flag in valued takes the next word as its value unless
// it has one ("-f x" or "-f=x"); others have the value after "=", if any.
func positional(args []string, valued map[string]bool) (pos []string, flags map[string]string) {
	flags = map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if valued[name] && !hasVal && i+1 < len(args) {
			i++
			val = args[i]
		}
		flags[name] = val
	}
	return pos, flags
}

// kubectl [-n NS] VERB ...
func (w *walk) kubectl(s Step, args []string) {
	pos, flags := positional(args, map[string]bool{"n": true, "namespace": true, "k": true, "o": true, "from-literal": true})
	ns := flags["n"]
	if ns == "" {
		ns = flags["namespace"]
	}
	if ns == "" {
		ns = "default"
	}
	verb := strings.Join(pos[:min(2, len(pos))], " ")
	switch {
	case verb == "create namespace" && len(pos) == 3:
		w.ns[pos[2]] = true
	case verb == "create secret" && len(pos) == 4 && pos[2] == "generic":
		if !w.ns[ns] {
			w.add(s, "namespace %s does not exist yet", ns)
		}
		w.secrets = append(w.secrets, Step{Line: s.Line, Words: []string{ns, pos[3]}})
	case len(pos) == 1 && pos[0] == "apply" && flags["k"] != "":
		w.apply(s, flags["k"], true)
	case len(pos) == 2 && pos[0] == "kustomize":
		w.apply(s, pos[1], false)
	case verb == "rollout status" && len(pos) == 3:
		kind, name, _ := strings.Cut(pos[2], "/")
		kinds := map[string]string{"deployment": "Deployment", "deploy": "Deployment", "statefulset": "StatefulSet",
			"sts": "StatefulSet", "daemonset": "DaemonSet", "ds": "DaemonSet"}
		if w.find(kinds[kind], ns, name) == nil {
			w.add(s, "no applied %s %s in namespace %s", kind, name, ns)
		}
	case len(pos) == 3 && pos[0] == "port-forward":
		w.portForward(s, ns, pos[1], pos[2])
	case verb == "get secret" && len(pos) == 3:
		if !w.secretCreated(ns, pos[2]) {
			w.add(s, "secret %s in namespace %s was not created before", pos[2], ns)
		}
	default:
		w.add(s, "kubectl %s: not a command the check knows", strings.Join(args, " "))
	}
}

// apply renders dir and, when apply is set, records its objects.
func (w *walk) apply(s Step, dir string, apply bool) {
	dir = path.Clean(dir)
	if !w.sb.Exists(path.Join(dir, "kustomization.yaml")) {
		w.add(s, "%s holds no kustomization.yaml", dir)
		return
	}
	out, err := w.sb.Render(dir)
	if err != nil {
		w.add(s, "kubectl kustomize %s: %v", dir, err)
		return
	}
	f, err := Decode(dir+"/rendered.yaml", out)
	if err != nil {
		w.add(s, "rendered %s: %v", dir, err)
		return
	}
	for _, p := range Check(w.root, w.code, []File{f}) {
		w.add(s, "%s", p)
	}
	if !apply {
		return
	}
	for _, d := range f.Docs {
		m := asMap(d)
		o := object{dir: dir, kind: str(m, "kind"), name: str(asMap(m["metadata"]), "name"), ns: str(asMap(m["metadata"]), "namespace"), m: m}
		if o.ns == "" {
			o.ns = "default"
		}
		if o.kind == "Namespace" {
			w.ns[o.name] = true
		}
		w.applied = append(w.applied, o)
	}
}

func (w *walk) find(kind, ns, name string) *object {
	for i := range w.applied {
		if o := &w.applied[i]; o.kind == kind && o.name == name && (kind == "Namespace" || o.ns == ns) {
			return o
		}
	}
	return nil
}

// portForward: svc/NAME with a port the Service exposes ("PORT" or
// "LOCAL:PORT").
func (w *walk) portForward(s Step, ns, target, ports string) {
	name, ok := strings.CutPrefix(target, "svc/")
	if !ok {
		w.add(s, "port-forward %s: the walk-through forwards Services (svc/NAME)", target)
		return
	}
	svc := w.find("Service", ns, name)
	if svc == nil {
		w.add(s, "no applied Service %s in namespace %s", name, ns)
		return
	}
	local, remote, found := strings.Cut(ports, ":")
	if !found {
		remote = local
	}
	for _, p := range asList(dig(svc.m, "spec", "ports")) {
		if n, ok := toInt(asMap(p)["port"]); ok && strconv.Itoa(n) == remote {
			w.forwards[local] = *svc
			return
		}
	}
	w.add(s, "Service %s in namespace %s has no port %s", name, ns, remote)
}

// goRun: go run ./cmd/X with flags X defines; an address flag on
// 127.0.0.1 names a forwarded port, quotacheck's -policy names applied
// policies, a file flag names a file written before.
func (w *walk) goRun(s Step, args []string) {
	if len(args) < 2 || args[0] != "run" {
		w.add(s, "go %s: want go run ./cmd/NAME", strings.Join(args, " "))
		return
	}
	cmdName, ok := strings.CutPrefix(args[1], "./cmd/")
	cmd, found := w.code.Commands[cmdName]
	if !ok || !found {
		w.add(s, "go run %s: no command under cmd/", args[1])
		return
	}
	var fwd *object
	for i := 2; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue // a subcommand or an argument
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		def, known := cmd.Flags[name]
		if !known {
			w.add(s, "cmd/%s has no flag -%s", cmdName, name)
			continue
		}
		if !hasVal && def != "false" && def != "true" && i+1 < len(args) {
			i++
			val = args[i]
		}
		switch {
		case strings.HasPrefix(val, "127.0.0.1:"):
			port := strings.TrimPrefix(val, "127.0.0.1:")
			svc, ok := w.forwards[port]
			if !ok {
				w.add(s, "-%s %s: no port-forward listens on %s", name, val, port)
				continue
			}
			fwd = &svc
		case name == "token-file" && !w.written[val]:
			w.add(s, "-%s %s: no step wrote that file", name, val)
		}
	}
	if cmdName != "quotacheck" {
		return
	}
	_, flags := positional(args[2:], map[string]bool{"policy": true, "addr": true, "subject": true, "n": true})
	for _, p := range strings.Split(flags["policy"], ",") {
		if fwd == nil {
			w.add(s, "quotacheck: -addr names no forwarded regional node")
			return
		}
		if !w.policyApplied(fwd.ns, p) {
			w.add(s, "quotacheck: policy %q is in no policy file applied in namespace %s", p, fwd.ns)
		}
	}
}

// policyApplied reports whether a ConfigMap applied in ns holds a policy
// file (the project's own format) that defines name.
func (w *walk) policyApplied(ns, name string) bool {
	for _, o := range w.applied {
		if o.kind != "ConfigMap" || o.ns != ns {
			continue
		}
		for _, v := range asMap(o.m["data"]) {
			text, _ := v.(string)
			var doc struct {
				Policies []struct {
					Name string `yaml:"name"`
				} `yaml:"policies"`
			}
			if yaml.Unmarshal([]byte(text), &doc) != nil {
				continue
			}
			for _, p := range doc.Policies {
				if p.Name == name {
					return true
				}
			}
		}
	}
	return false
}

// printf 'FORMAT' > FILE, with \n and \t escapes and no verbs.
func (w *walk) printf(s Step) {
	if len(s.Words) != 4 || s.Words[2] != ">" {
		w.add(s, "printf: want printf 'TEXT' > FILE")
		return
	}
	text := s.Words[1]
	if strings.Contains(strings.ReplaceAll(text, "%%", ""), "%") {
		w.add(s, "printf: the check does not expand format verbs")
		return
	}
	text = strings.NewReplacer(`\n`, "\n", `\t`, "\t", `\\`, `\`, "%%", "%").Replace(text)
	if err := w.sb.WriteFile(s.Words[3], []byte(text)); err != nil {
		w.add(s, "printf: %v", err)
	}
}

func (w *walk) secretCreated(ns, name string) bool {
	for _, c := range w.secrets {
		if c.Words[0] == ns && c.Words[1] == name {
			return true
		}
	}
	return false
}

// finish checks what needs the whole walk: every Secret created is read
// by an applied object of its namespace; every image built is run by an
// applied object, and, when the walk builds images, every image of ours
// an applied object runs was built and loaded.
func (w *walk) finish() {
	for _, c := range w.secrets {
		ns, name := c.Words[0], c.Words[1]
		read := false
		for _, o := range w.applied {
			if o.ns == ns && readsSecret(o.m, name, "") {
				read = true
				break
			}
		}
		if !read {
			w.add(c, "no applied object in namespace %s reads secret %s", ns, name)
		}
	}
	run := map[string]bool{}
	for _, o := range w.applied {
		if wl, ok := podTemplate(o.m); ok {
			for _, ct := range wl.containers {
				run[str(asMap(ct), "image")] = true
			}
		}
	}
	for img := range w.built {
		if !run[img] {
			w.problems = append(w.problems, Problem{Path: w.file, What: fmt.Sprintf("image %s is built but no applied object runs it", img)})
		}
	}
	if len(w.built) == 0 {
		return
	}
	for img := range run {
		if strings.HasPrefix(img, ImagePrefix) && !(w.built[img] && w.loaded[img]) {
			w.problems = append(w.problems, Problem{Path: w.file, What: fmt.Sprintf("image %s runs but the walk-through does not build and load it", img)})
		}
	}
}

// readsSecret reports whether v, found under key, names secret name: a
// secretName, or the name of a secretKeyRef, secretRef or secret.
func readsSecret(v any, name, key string) bool {
	switch v := v.(type) {
	case map[string]any:
		if v["secretName"] == name {
			return true
		}
		if (key == "secretKeyRef" || key == "secretRef" || key == "secret") && v["name"] == name {
			return true
		}
		for k, x := range v {
			if readsSecret(x, name, k) {
				return true
			}
		}
	case []any:
		for _, x := range v {
			if readsSecret(x, name, key) {
				return true
			}
		}
	}
	return false
}
