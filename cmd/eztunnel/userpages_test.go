package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/eztunnel/eztunnel/internal/cli/clidoc"
)

// userPages are the pages written for users, as opposed to the design notes
// (docs/families), the contributors' pages and the dated measurements
// (docs/measurements): they describe what the software does, so they carry
// no dates, commit ids or issue numbers, and every flag and chart value they
// cite exists.
var userPages = []string{
	"README.md",
	"docs/getting-started.md",
	"docs/operating.md",
	"docs/kube-proxy-replacement.md",
	"docs/kubernetes.md",
	"docs/host.md",
	"docs/security.md",
	"docs/tracing.md",
	"docs/kubectl-plugin.md",
	"docs/monitoring.md",
	"docs/reference/*.md",
}

// pendingValues are chart values written on another branch that the user
// pages may cite before it is merged; once values.yaml has them they are
// checked as any other. Remove an entry when its value has landed.
var pendingValues = map[string]string{}

// foreignFlags are flags of other programs that the user pages name alone,
// in prose, where the line does not say which program takes them.
var foreignFlags = map[string]string{
	"--all": "skopeo copy --all (the whole image index)",
}

// foreignCommand: a command line of another program, whose flags are its own
// (helm, kubectl, skopeo, ...). eztunnel's lines are found by binary name.
// A binary is at the command position: the line's start (after sudo, a
// prompt or VAR=value) or after `--` (kubectl exec), `&&`, `;` or `|`.
var ezBinary = regexp.MustCompile(`(?:^|--\s+|&&\s*|;\s*|\|\s*)(?:\$\s+)?(?:sudo\s+)?(?:[A-Z_]+=\S*\s+)*(?:\S*/)?(eztunnel(?:-lab)?)(?:\s|$)`)

var (
	pageDate   = regexp.MustCompile(`\b20\d\d-[01]\d-[0-3]\d\b`)
	pageHex    = regexp.MustCompile(`[0-9A-Za-z_:.-]*[0-9a-f]{7,40}[0-9A-Za-z_:-]*`)
	pureHex    = regexp.MustCompile(`^[0-9a-f]{7,40}$`)
	pageIssue  = regexp.MustCompile(`(?:^|[^\w&/])#[0-9]+\b|(?i)\bissues? #?[0-9]+\b`)
	pageFlag   = regexp.MustCompile(`(?:^|[\s(\x60/"'\[])(--[a-z][a-z0-9-]*)`)
	pageSet    = regexp.MustCompile(`--set(?:-string)?[ =]([A-Za-z0-9_.\[\]-]+)=`)
	codeSpanRe = regexp.MustCompile("`([^`]+)`")
	valuePath  = regexp.MustCompile(`^([a-z][A-Za-z0-9]*(?:\.[a-zA-Z][A-Za-z0-9]*)*)(\.\*)?(?:[=:].*)?$`)
	fileLike   = regexp.MustCompile(`\.(md|ya?ml|json|go|c|h|tar|gz|sh|txt|log|svg|png|io)\b`)
)

type pageProblem struct {
	line int
	kind string // date, commit, issue, flag, value
	text string
}

// pageChecker holds what a page may cite: flags of the two binaries and of
// a few other programs, and the chart's values.
type pageChecker struct {
	flags  map[string]bool
	values map[string]bool // every values.yaml path, leaves and objects
}

func (c *pageChecker) check(doc string) []pageProblem {
	var out []pageProblem
	fence := ""
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		n, line := i+1, lines[i]
		inFence := fence != ""
		if f := docFence(line, fence); f != "" || fence != "" {
			opening := fence == ""
			fence = f
			if opening || f == "" && inFence && strings.TrimSpace(strings.Trim(strings.TrimSpace(line), "`~")) == "" {
				continue // the fence line itself
			}
		}
		for _, m := range pageDate.FindAllString(line, -1) {
			out = append(out, pageProblem{n, "date", m})
		}
		for _, m := range pageHex.FindAllString(line, -1) {
			if id := commitID(m); id != "" {
				out = append(out, pageProblem{n, "commit", id})
			}
		}
		for _, m := range pageIssue.FindAllString(line, -1) {
			out = append(out, pageProblem{n, "issue", strings.TrimSpace(m)})
		}
		// Code: the whole line in a fence, else each code span; prose
		// outside code spans is checked for flags too.
		var code []string
		prose := line
		if fence != "" {
			for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
				i++ // a command continued on the next line
				line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(lines[i])
			}
			code = []string{line}
			prose = ""
		} else {
			for _, m := range codeSpanRe.FindAllStringSubmatch(line, -1) {
				code = append(code, m[1])
			}
			prose = codeSpanRe.ReplaceAllString(line, " ")
		}
		for _, s := range code {
			out = append(out, c.checkCode(n, s, fence == "")...)
		}
		for _, m := range pageFlag.FindAllStringSubmatch(prose, -1) {
			if !c.flagOK(m[1]) {
				out = append(out, pageProblem{n, "flag", m[1]})
			}
		}
		for _, m := range pageSet.FindAllStringSubmatch(prose, -1) {
			if !c.valueOK(m[1]) {
				out = append(out, pageProblem{n, "value", m[1]})
			}
		}
	}
	return out
}

// commitID returns the commit-id-like word of a hex match: 7 to 40
// lowercase hex digits standing alone, with a digit and a letter, not an
// image digest (sha256:...), a 0x number, part of a UUID or of a longer
// word.
func commitID(m string) string {
	if strings.Contains(m, "sha256:") || strings.HasPrefix(m, "0x") {
		return ""
	}
	for _, w := range regexp.MustCompile(`[^0-9A-Za-z_]+`).Split(m, -1) {
		if !pureHex.MatchString(w) || !strings.ContainsAny(w, "0123456789") || !strings.ContainsAny(w, "abcdef") {
			continue
		}
		if strings.Count(m, "-") >= 4 && regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`).MatchString(m) {
			continue // a UUID
		}
		return w
	}
	return ""
}

// checkCode checks one code line or span: the flags of an eztunnel command
// line, a flag named alone, --set keys, and chart value paths named alone.
func (c *pageChecker) checkCode(n int, s string, alone bool) []pageProblem {
	var out []pageProblem
	s = strings.TrimSpace(s)
	for _, m := range pageSet.FindAllStringSubmatch(s, -1) {
		if !c.valueOK(m[1]) {
			out = append(out, pageProblem{n, "value", m[1]})
		}
	}
	var flagsOf string
	if loc := ezBinary.FindAllStringSubmatchIndex(s, -1); loc != nil {
		flagsOf = s[loc[len(loc)-1][1]:] // after the last eztunnel binary
		if i := strings.Index(flagsOf, "#"); i >= 0 {
			flagsOf = flagsOf[:i] // a comment
		}
		for _, op := range []string{"|", ">", "&&", ";"} {
			if i := strings.Index(flagsOf, op); i >= 0 {
				flagsOf = flagsOf[:i]
			}
		}
	} else if alone && strings.HasPrefix(s, "--") && !strings.HasPrefix(s, "--set") {
		flagsOf = strings.Fields(s)[0] // a flag named alone
	}
	for _, m := range pageFlag.FindAllStringSubmatch(" "+flagsOf, -1) {
		if !c.flagOK(m[1]) {
			out = append(out, pageProblem{n, "flag", m[1]})
		}
	}
	if m := valuePath.FindStringSubmatch(s); m != nil && !fileLike.MatchString(s) && !strings.Contains(s, " ") {
		top, _, dotted := strings.Cut(m[1], ".")
		if (dotted || m[2] != "" || strings.ContainsAny(s, "=:")) && (c.values[top] || pendingValues[top] != "") && !c.valueOK(m[1]) {
			out = append(out, pageProblem{n, "value", m[1]})
		}
	}
	return out
}

func (c *pageChecker) flagOK(f string) bool {
	f, _, _ = strings.Cut(f, "=")
	return c.flags[f] || foreignFlags[f] != ""
}

// valueOK: path (list indexes dropped) is a value, an object of values,
// or below a free-form object of values.yaml (resources.limits.cpu).
func (c *pageChecker) valueOK(path string) bool {
	path = regexp.MustCompile(`\[[0-9]+\]`).ReplaceAllString(path, "")
	segs := strings.Split(path, ".")
	for i := len(segs); i > 0; i-- {
		p := strings.Join(segs[:i], ".")
		if c.values[p] || pendingValues[p] != "" && !c.values[p] {
			return i == len(segs) || c.values[p] && c.leafObject(p)
		}
	}
	return false
}

// leafObject: the values.yaml node at p is a map or list without
// sub-values listed (free-form: resources, nodeSelector, extraEnv).
func (c *pageChecker) leafObject(p string) bool {
	for v := range c.values {
		if strings.HasPrefix(v, p+".") {
			return false
		}
	}
	return true
}

func newPageChecker(t *testing.T) *pageChecker {
	t.Helper()
	c := &pageChecker{flags: clidoc.Flags(newRoot()), values: map[string]bool{}}
	// The lab binary's and the kubectl plugin's flags, from their reference
	// pages (their TestReferenceFlags keep the pages equal to their trees).
	for _, page := range []string{"eztunnel-lab-flags.md", "kubectl-eztunnel-flags.md"} {
		b, err := os.ReadFile("../../docs/reference/" + page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile("(?m)^\\| (?:`-[a-z]`, )?`(--[a-z0-9-]+)` \\|").FindAllStringSubmatch(string(b), -1) {
			c.flags[m[1]] = true
		}
	}
	if len(c.flags) < 60 {
		t.Fatalf("%d flags in the two binaries: the trees or the lab's reference page changed?", len(c.flags))
	}
	raw, err := os.ReadFile("../../deploy/helm/eztunnel/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			c.values[prefix+k] = true
			if sub, ok := v.(map[string]any); ok {
				walk(prefix+k+".", sub)
			}
		}
	}
	walk("", values)
	// Keys only the schema describes (podSecurityContext.fsGroup) are values too.
	sraw, err := os.ReadFile("../../deploy/helm/eztunnel/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	type node struct {
		Properties map[string]*node `json:"properties"`
	}
	var schema node
	if err := json.Unmarshal(sraw, &schema); err != nil {
		t.Fatal(err)
	}
	var walkSchema func(prefix string, n *node)
	walkSchema = func(prefix string, n *node) {
		for k, sub := range n.Properties {
			c.values[prefix+k] = true
			walkSchema(prefix+k+".", sub)
		}
	}
	walkSchema("", &schema)
	c.values["global"] = true // the schema's, set by a parent chart
	if len(c.values) < 40 {
		t.Fatalf("%d values in values.yaml: its layout changed?", len(c.values))
	}
	for v := range pendingValues {
		if c.values[v] {
			t.Logf("pendingValues: %s is in values.yaml now; remove it from the list", v)
		}
	}
	return c
}

// TestUserPages: the user pages (userPages) hold no dates, commit ids or
// issue numbers, and cite only flags of the two binaries (command lines of
// eztunnel and eztunnel-lab, flags named alone) and chart values of
// values.yaml (--set keys, value paths named alone).
func TestUserPages(t *testing.T) {
	c := newPageChecker(t)
	var files []string
	for _, p := range userPages {
		m, _ := filepath.Glob(filepath.Join("../..", p))
		if len(m) == 0 {
			t.Errorf("user page %s: no such file", p)
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel("../..", f)
		for _, p := range c.check(string(b)) {
			t.Errorf("%s:%d: %s %q (user pages hold no dates, commit ids or issue numbers, and cite only flags and chart values that exist)", rel, p.line, p.kind, p.text)
		}
	}
	if len(files) < 10 {
		t.Fatalf("checked %d user pages", len(files))
	}
}

// TestUserPagesCatch: each check of TestUserPages finds a planted bad line,
// and lets the look-alikes the pages legitimately hold pass.
func TestUserPagesCatch(t *testing.T) {
	c := newPageChecker(t)
	bad := map[string]string{
		"date":   "Run on 2026-11-23 with 10 rounds.",
		"commit": "Binary built at commit 0a907cd, under the kernel lock.",
		"issue":  "The reader gate (issue 40) and the benchmark of #13.",
		"flag":   "Start it with `sudo bin/eztunnel run --max-socket 10`.",
		"value":  "```sh\nhelm install eztunnel deploy/helm/eztunnel --set maxSocket=10\n```",
	}
	more := map[string]string{
		"flag":  "Turn it off with `--no-such-flag`, or --other-missing in prose.",
		"value": "Set `services.nodeport.enabled` (the case matters) or `traffic.includePort=80`.",
	}
	for kind, doc := range bad {
		for _, d := range []string{doc, more[kind]} {
			if d == "" {
				continue
			}
			ps := c.check(d)
			found := false
			for _, p := range ps {
				found = found || p.kind == kind
			}
			if !found {
				t.Errorf("planted %s not caught in %q (found %v)", kind, d, ps)
			}
		}
	}
	good := strings.Join([]string{
		"Pin it by digest: `image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef`.",
		"A UUID such as 123e4567-e89b-12d3-a456-426614174000, a number 16777216 or 0x1f2e3d4c5b.",
		"Headings link as [this](#nodes); an HTML entity &#124; is no issue.",
		"`sudo bin/eztunnel run --max-sockets 10 --bypass=off`, `eztunnel-lab trace --plot out`, `--pin-path`.",
		"```sh",
		"helm upgrade eztunnel deploy/helm/eztunnel --reuse-values --set image.tag=0.1.1 --set extraEnv[0].name=X",
		"kubectl -n kube-system exec $AGENT -- /eztunnel status -o json   # --timeout is kubectl's here",
		"skopeo copy --all oci-archive:bin/eztunnel-image.tar docker://registry.example.com/eztunnel:0.1.0",
		"```",
		"Values `services.nodePort.enabled`, `metrics.serviceMonitor`, `image.*`, `resources.limits.memory`, `bypass: off`, `k8sServiceHost`.",
		"Files `services.md`, `values.yaml`; labels `eztunnel.io/shortcut=enabled`; Skopeo's `--all`.",
	}, "\n")
	if ps := c.check(good); len(ps) > 0 {
		t.Errorf("look-alikes flagged: %v", ps)
	}
}
