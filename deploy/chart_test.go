package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/sysexec"
)

const chartDir = "helm/eztunnel"

// helm runs the helm CLI built from tools/helm.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := sysexec.Command(t.Context(), tool(t, "helm"), args...)
	cmd.Dir = repoRoot(t) + "/deploy"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, errors.New(err.Error() + ": " + stderr.String())
	}
	return out, nil
}

type obj = map[string]any

// render is `helm template` of the chart into kube-system, decoded.
func render(t *testing.T, set ...string) []obj {
	t.Helper()
	args := []string{"template", "eztunnel", chartDir, "--namespace", "kube-system"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm %v: %v", args, err)
	}
	var docs []obj
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var d obj
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding the rendering: %v", err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	if len(docs) == 0 {
		t.Fatal("the chart rendered nothing")
	}
	return docs
}

// get walks a decoded document: keys for maps, ints for lists.
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(obj)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func strs(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

func kinds(docs []obj) map[string][]obj {
	out := map[string][]obj{}
	for _, d := range docs {
		k, _ := d["kind"].(string)
		out[k] = append(out[k], d)
	}
	return out
}

func daemonSet(t *testing.T, docs []obj) obj {
	t.Helper()
	ds := kinds(docs)["DaemonSet"]
	if len(ds) != 1 {
		t.Fatalf("%d DaemonSets rendered, want 1", len(ds))
	}
	return ds[0]
}

func container(t *testing.T, docs []obj) obj {
	t.Helper()
	cs, _ := get(daemonSet(t, docs), "spec", "template", "spec", "containers").([]any)
	if len(cs) != 1 {
		t.Fatalf("%d containers, want 1", len(cs))
	}
	return cs[0].(obj)
}

func TestChartLint(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", chartDir); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}

// TestManifestCommitted: deploy/manifests/eztunnel.yaml is the chart's
// rendering with default values (what `make manifests` writes).
func TestManifestCommitted(t *testing.T) {
	want, err := helm(t, "template", "eztunnel", chartDir, "--namespace", "kube-system")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("manifests/eztunnel.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var body []string
	for _, l := range strings.SplitAfter(string(got), "\n") {
		if len(body) == 0 && strings.HasPrefix(l, "# ") && !strings.HasPrefix(l, "# Source:") {
			continue // the generated-file header
		}
		body = append(body, l)
	}
	if strings.Join(body, "") != string(want) {
		t.Fatal("deploy/manifests/eztunnel.yaml differs from the chart's rendering: run `make manifests` and commit")
	}
}

func TestChartLeastPrivilege(t *testing.T) {
	docs := render(t)
	ds := daemonSet(t, docs)
	pod := get(ds, "spec", "template", "spec").(obj)
	c := container(t, docs)
	sc, _ := c["securityContext"].(obj)
	if sc == nil {
		t.Fatal("no securityContext")
	}
	if sc["privileged"] != false || sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false ||
		sc["runAsUser"] != 0 {
		t.Errorf("securityContext %v", sc)
	}
	if got := strs(get(sc, "capabilities", "drop")); !reflect.DeepEqual(got, []string{"ALL"}) {
		t.Errorf("capabilities dropped %v, want [ALL]", got)
	}
	if got := strs(get(sc, "capabilities", "add")); !reflect.DeepEqual(got, []string{"BPF", "NET_ADMIN", "PERFMON"}) {
		t.Errorf("capabilities added %v, want [BPF NET_ADMIN PERFMON]", got)
	}
	if get(sc, "seccompProfile", "type") != "Unconfined" {
		t.Errorf("seccompProfile %v", sc["seccompProfile"])
	}
	if pod["hostNetwork"] != true || pod["hostPID"] == true || pod["hostIPC"] == true {
		t.Errorf("hostNetwork %v hostPID %v hostIPC %v", pod["hostNetwork"], pod["hostPID"], pod["hostIPC"])
	}
	if c["ports"] != nil {
		t.Errorf("container ports %v: on the host network they are host ports, which block a surge pod", c["ports"])
	}
	if pod["priorityClassName"] != "system-node-critical" || pod["terminationGracePeriodSeconds"] != 60 {
		t.Errorf("priorityClassName %v, terminationGracePeriodSeconds %v", pod["priorityClassName"], pod["terminationGracePeriodSeconds"])
	}
	if tol := get(pod, "tolerations", 0); !reflect.DeepEqual(tol, obj{"operator": "Exists"}) {
		t.Errorf("tolerations %v, want every taint tolerated", pod["tolerations"])
	}

	// Host paths: exactly bpffs, cgroup2 and the lock directory.
	mounts := map[string]obj{}
	for _, m := range c["volumeMounts"].([]any) {
		mounts[m.(obj)["name"].(string)] = m.(obj)
	}
	vols := map[string]any{}
	for _, v := range pod["volumes"].([]any) {
		vols[v.(obj)["name"].(string)] = v.(obj)["hostPath"]
	}
	wantVols := map[string]any{
		"bpffs":   obj{"path": "/sys/fs/bpf", "type": "Directory"},
		"cgroup2": obj{"path": "/sys/fs/cgroup", "type": "Directory"},
		"lock":    obj{"path": "/run/eztunnel", "type": "DirectoryOrCreate"},
	}
	if !reflect.DeepEqual(vols, wantVols) {
		t.Errorf("volumes %v, want %v", vols, wantVols)
	}
	if m := mounts["bpffs"]; m["mountPath"] != "/sys/fs/bpf" || m["mountPropagation"] != "HostToContainer" {
		t.Errorf("bpffs mount %v", m)
	}
	if m := mounts["cgroup2"]; m["mountPath"] != "/sys/fs/cgroup" || m["readOnly"] != true {
		t.Errorf("cgroup2 mount %v", m)
	}
	if m := mounts["lock"]; m["mountPath"] != "/run/eztunnel" {
		t.Errorf("lock mount %v", m)
	}

	// Downward API.
	env := map[string]any{}
	for _, e := range c["env"].([]any) {
		if v, ok := e.(obj)["value"]; ok {
			env[e.(obj)["name"].(string)] = v
			continue
		}
		env[e.(obj)["name"].(string)] = get(e, "valueFrom", "fieldRef", "fieldPath")
	}
	// The downward API, and the places exec'd commands read (cmd/eztunnel/layout.go).
	wantEnv := map[string]any{"NODE_NAME": "spec.nodeName", "POD_NAME": "metadata.name",
		"POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid",
		"EZTUNNEL_PIN_PATH": "/sys/fs/bpf/eztunnel", "EZTUNNEL_RUN_DIR": "/run/eztunnel", "EZTUNNEL_LOCK_FILE": "/run/eztunnel/agent.lock"}
	if !reflect.DeepEqual(env, wantEnv) {
		t.Errorf("env %v, want %v", env, wantEnv)
	}

	// Both probes through `eztunnel ready` in the pod: the health port is
	// on loopback (an httpGet would not reach it), and readiness checks the
	// node's lock names this pod before asking the port (hostNetwork: an
	// httpGet would reach the old agent in a surge update).
	wantLive := []any{"/eztunnel", "ready", "--healthz", "--health-addr=127.0.0.1:9877"}
	wantReady := []any{"/eztunnel", "ready", "--lock-file=/run/eztunnel/agent.lock", "--health-addr=127.0.0.1:9877"}
	if !reflect.DeepEqual(get(c, "livenessProbe", "exec", "command"), wantLive) || get(c, "livenessProbe", "httpGet") != nil ||
		!reflect.DeepEqual(get(c, "readinessProbe", "exec", "command"), wantReady) || get(c, "readinessProbe", "httpGet") != nil {
		t.Errorf("probes %v %v", c["livenessProbe"], c["readinessProbe"])
	}
	if !slices.Contains(c["args"].([]any), any("--health-addr=127.0.0.1:9877")) || !slices.Contains(c["args"].([]any), any("--metrics-addr=0.0.0.0:9876")) {
		t.Errorf("health on loopback, metrics on the node's addresses by default: %v", c["args"])
	}

	// Both surge modes render.
	for _, mode := range [][2]string{{"1", "0"}, {"0", "1"}} {
		d := daemonSet(t, render(t, "updateStrategy.rollingUpdate.maxUnavailable="+mode[0], "updateStrategy.rollingUpdate.maxSurge="+mode[1]))
		ru := get(d, "spec", "updateStrategy", "rollingUpdate")
		if get(d, "spec", "updateStrategy", "type") != "RollingUpdate" || !reflect.DeepEqual(ru, obj{"maxUnavailable": atoi(mode[0]), "maxSurge": atoi(mode[1])}) {
			t.Errorf("updateStrategy %v", get(d, "spec", "updateStrategy"))
		}
	}

	// SYS_ADMIN, when asked for, drops allowPrivilegeEscalation (the API
	// server refuses the two together).
	sc = container(t, render(t, "capabilities={BPF,NET_ADMIN,PERFMON,SYS_ADMIN}"))["securityContext"].(obj)
	if _, ok := sc["allowPrivilegeEscalation"]; ok || sc["privileged"] != false {
		t.Errorf("with SYS_ADMIN: %v", sc)
	}

	// Adoption is off by default (the agent is told so); on, it adds what
	// entering pods' network namespaces needs: SYS_ADMIN, SYS_PTRACE and
	// the host PIDs.
	if !slices.Contains(strs(c["args"]), "--adopt=false") {
		t.Errorf("default args %v lack --adopt=false", c["args"])
	}
	// The Service LB's socket destroy enters the pods' namespaces too: the
	// same three with services.enabled, and so does the close reset on the
	// covered namespaces' devices only (their loopbacks, found through their
	// processes).
	for _, set := range []string{"adoption.enabled=true", "services.enabled=true", "closeResetDevices=covered"} {
		docs = render(t, set)
		sc = container(t, docs)["securityContext"].(obj)
		if got := strs(get(sc, "capabilities", "add")); !reflect.DeepEqual(got, []string{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"}) {
			t.Errorf("%s: capabilities added %v", set, got)
		}
		if get(daemonSet(t, docs), "spec", "template", "spec", "hostPID") != true {
			t.Errorf("%s: hostPID is not set", set)
		}
		if _, ok := sc["allowPrivilegeEscalation"]; ok {
			t.Errorf("%s: allowPrivilegeEscalation with SYS_ADMIN: %v", set, sc)
		}
	}
	sc = container(t, render(t, "adoption.enabled=true", "capabilities={BPF,NET_ADMIN,PERFMON,SYS_ADMIN}"))["securityContext"].(obj)
	if got := strs(get(sc, "capabilities", "add")); len(got) != 5 {
		t.Errorf("SYS_ADMIN twice: %v", got)
	}
}

func atoi(s string) int { return int(s[0] - '0') }

func TestChartBadValues(t *testing.T) {
	for set, want := range map[string]string{
		"capabilities={CAP_BPF}":    "without CAP_",
		"capabilities={bpf}":        "/capabilities/0",
		"defaultPolicy=on":          "defaultPolicy",
		"cgroupDriver=docker":       "cgroupDriver",
		"cgroup2Path=sys/fs/cgroup": "cgroup2Path",
		"pinPath=/run/eztunnel":     "pinPath",
		// values.schema.json: types, ranges and unknown keys.
		"maxSockets=abc":                  "/maxSockets",
		"maxSockets=-5":                   "/maxSockets",
		"maxUnread=1.5":                   "/maxUnread",
		"imag.tag=x":                      "'imag' not allowed",
		"metrics.port=70000":              "/metrics/port",
		"metrics.prt=1":                   "'prt' not allowed",
		"traffic.includePorts={0}":        "/traffic/includePorts/0",
		"traffic.excludeCIDRs={10.0.0.0}": "/traffic/excludeCIDRs/0",
		"log.level=verbose":               "/log/level",
		"ipv6=maybe":                      "/ipv6",
		"takeoverTimeout=soon":            "/takeoverTimeout",
		"image.digest=latest":             "/image/digest",
		"image.pullPolicy=Sometimes":      "/image/pullPolicy",
		"bypass=maybe":                    "/bypass",
		"services.enabled=yes":            "/services/enabled",
		"services.nodeport.enabled=true":  "'nodeport' not allowed",
		"extraArgs={services}":            "/extraArgs/0",
		"services.nodePort.enabled=true":  "needs services.enabled",
		// Pod settings: types, ranges, unknown keys, and the pairs.
		"k8sServiceHost=10.0.0.1":                   "set both",
		"k8sServicePort=6443":                       "set both",
		"k8sServicePort=70000":                      "/k8sServicePort",
		"k8sServiceHost=https://10.0.0.1":           "/k8sServiceHost",
		"seLinuxOptions.typ=spc_t":                  "'typ' not allowed",
		"podSecurityContext.fsGroup=-1":             "/podSecurityContext/fsGroup",
		"podSecurityContext.privileged=true":        "'privileged' not allowed",
		"commonLabels.app\\.kubernetes\\.io/name=x": "the chart's own label",
		"extraVolumes[0].hostPath.path=/x":          "/extraVolumes/0",
		"extraVolumeMounts[0].name=x":               "/extraVolumeMounts/0",
		"extraInitContainers[0].name=x":             "/extraInitContainers/0",
		"readinessProbe.periodSeconds=0":            "/readinessProbe/periodSeconds",
		"livenessProbe.successThreshold=2":          "/livenessProbe/successThreshold",
		"startupProbe.enabled=yes":                  "/startupProbe/enabled",
		"livenessProbe.command=x":                   "'command' not allowed",
		"dashboards.label=a b":                      "/dashboards/label",
		"dashboards.namespace=Mon":                  "/dashboards/namespace",
		"prometheusRule.runbookBaseURL=docs.md#x":   "/prometheusRule/runbookBaseURL",
		"prometheusRule.enable=true":                "'enable' not allowed",
	} {
		_, err := helm(t, "template", "eztunnel", chartDir, "--set", set)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v, want an error naming %q", set, err, want)
		}
	}
}

// TestChartSizesAsTheAgent: the schema accepts a map size or unread bound
// exactly when the agent does (shortcut.Config.Validate), at and around
// every boundary: a value the agent would refuse on every node fails at
// helm install instead.
func TestChartSizesAsTheAgent(t *testing.T) {
	def := datapath.DefaultConfig().Config
	for _, c := range []struct {
		value string
		set   func(*shortcut.Config, uint32)
		at    []int64
	}{
		{"maxSockets", func(c *shortcut.Config, v uint32) { c.MaxSockets = v }, []int64{0, 1, 2, 3, 1 << 24, 1<<24 + 1}},
		{"maxPairs", func(c *shortcut.Config, v uint32) { c.MaxPairs = v }, []int64{0, 1, 2, 1 << 24, 1<<24 + 1}},
		{"maxUnread", func(c *shortcut.Config, v uint32) { c.MaxUnread = v }, []int64{0, 1, 1000, shortcut.MinMaxUnread - 1, shortcut.MinMaxUnread, shortcut.MaxMaxUnread, shortcut.MaxMaxUnread + 1}},
	} {
		for _, v := range c.at {
			cfg := def
			c.set(&cfg, uint32(v))
			agentOK := cfg.Validate() == nil
			_, err := helm(t, "template", "eztunnel", chartDir, "--set", fmt.Sprintf("%s=%d", c.value, v))
			if chartOK := err == nil; chartOK != agentOK {
				t.Errorf("%s=%d: the chart accepts it %v, the agent %v (%v)", c.value, v, chartOK, agentOK, err)
			}
		}
	}
}

// TestChartRBAC: read only, pods and namespaces cluster-wide, the chart's
// own DaemonSet in its namespace, bound to the agent's ServiceAccount, and
// nothing else is rendered. Services, EndpointSlices and Nodes only with
// services.enabled (TestChartServicesRBAC).
func TestChartRBAC(t *testing.T) {
	for _, name := range []string{"eztunnel", "custom"} {
		var docs []obj
		if name == "eztunnel" {
			docs = render(t)
		} else {
			docs = render(t, "fullnameOverride="+name)
		}
		byKind := kinds(docs)
		var ks []string
		for k, l := range byKind {
			for range l {
				ks = append(ks, k)
			}
		}
		sort.Strings(ks)
		if want := []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role", "RoleBinding", "ServiceAccount"}; !reflect.DeepEqual(ks, want) {
			t.Fatalf("rendered %v, want %v", ks, want)
		}
		if n := get(daemonSet(t, docs), "metadata", "name"); n != name {
			t.Errorf("DaemonSet %v, want %s", n, name)
		}
		sa := get(byKind["ServiceAccount"][0], "metadata", "name")
		if get(daemonSet(t, docs), "spec", "template", "spec", "serviceAccountName") != sa {
			t.Errorf("the DaemonSet does not run as the ServiceAccount %v", sa)
		}
		for _, r := range append(byKind["ClusterRole"], byKind["Role"]...) {
			for _, rule := range r["rules"].([]any) {
				if v := strs(get(rule, "verbs")); !reflect.DeepEqual(v, []string{"get", "list", "watch"}) && !reflect.DeepEqual(v, []string{"list"}) {
					t.Errorf("%s verbs %v, want get, list, watch or list (read only)", r["kind"], v)
				}
			}
		}
		cr := byKind["ClusterRole"][0]["rules"].([]any)
		if len(cr) != 1 || !reflect.DeepEqual(strs(get(cr[0], "apiGroups")), []string{""}) ||
			!reflect.DeepEqual(strs(get(cr[0], "resources")), []string{"pods", "namespaces"}) || get(cr[0], "resourceNames") != nil {
			t.Errorf("ClusterRole rules %v", cr)
		}
		role := byKind["Role"][0]
		rr := role["rules"].([]any)
		if get(role, "metadata", "namespace") != "kube-system" || len(rr) != 2 ||
			!reflect.DeepEqual(strs(get(rr[0], "apiGroups")), []string{"apps"}) ||
			!reflect.DeepEqual(strs(get(rr[0], "resources")), []string{"daemonsets"}) ||
			!reflect.DeepEqual(strs(get(rr[0], "resourceNames")), []string{name}) ||
			!reflect.DeepEqual(strs(get(rr[1], "resources")), []string{"events"}) || !reflect.DeepEqual(strs(get(rr[1], "verbs")), []string{"list"}) {
			t.Errorf("Role %v", role)
		}
		for _, b := range append(byKind["ClusterRoleBinding"], byKind["RoleBinding"]...) {
			want := []any{obj{"kind": "ServiceAccount", "name": sa, "namespace": "kube-system"}}
			if !reflect.DeepEqual(b["subjects"], want) {
				t.Errorf("%s subjects %v", b["kind"], b["subjects"])
			}
		}
	}
	// The optional ServiceMonitor and its Service.
	byKind := kinds(render(t, "metrics.serviceMonitor.enabled=true"))
	if len(byKind["ServiceMonitor"]) != 1 || len(byKind["Service"]) != 1 {
		t.Errorf("serviceMonitor.enabled rendered %d ServiceMonitors and %d Services", len(byKind["ServiceMonitor"]), len(byKind["Service"]))
	}
}

// TestChartServicesRBAC: services.enabled adds read access to Services,
// Nodes and EndpointSlices, and only it; without it none of them is granted.
func TestChartServicesRBAC(t *testing.T) {
	granted := func(docs []obj) map[string]bool {
		out := map[string]bool{}
		for _, r := range kinds(docs)["ClusterRole"] {
			for _, rule := range r["rules"].([]any) {
				for _, g := range strs(get(rule, "apiGroups")) {
					for _, res := range strs(get(rule, "resources")) {
						out[g+"/"+res] = true
						if v := strs(get(rule, "verbs")); !reflect.DeepEqual(v, []string{"get", "list", "watch"}) {
							t.Errorf("%s/%s verbs %v, want get, list, watch", g, res, v)
						}
					}
				}
			}
		}
		return out
	}
	svc := []string{"/services", "/nodes", "discovery.k8s.io/endpointslices"}
	off := granted(render(t))
	for _, set := range [][]string{{"services.enabled=true"}, {"services.enabled=true", "services.nodePort.enabled=true"}} {
		on := granted(render(t, set...))
		for _, r := range svc {
			if !on[r] {
				t.Errorf("%v: %s not granted", set, r)
			}
		}
		if len(on) != len(off)+len(svc) {
			t.Errorf("%v: granted %v, want %v and %v", set, on, off, svc)
		}
	}
	for _, r := range svc {
		if off[r] {
			t.Errorf("services off: %s granted", r)
		}
	}
}

// valueFlags maps each value to a setting and the argument it must become.
var valueFlags = []struct{ value, set, arg string }{
	{"defaultPolicy", "defaultPolicy=enabled", "--default-policy=enabled"},
	{"cgroup2Path", "cgroup2Path=/sys/fs/cgroup/unified", "--cgroup2-root=/sys/fs/cgroup/unified"},
	{"podsCgroup", "podsCgroup=/sys/fs/cgroup/unified/kubepods", "--pods-cgroup=/sys/fs/cgroup/unified/kubepods"},
	{"cgroupDriver", "cgroupDriver=systemd", "--cgroup-driver=systemd"},
	{"pinPath", "pinPath=/sys/fs/bpf/ez2", "--pin-path=/sys/fs/bpf/ez2"},
	{"lockDir", "lockDir=/run/ez2", "--lock-file=/run/ez2/agent.lock"},
	{"lockDir", "lockDir=/run/ez2", "--run-dir=/run/ez2"},
	{"bindAddress", "bindAddress=127.0.0.1", "--metrics-addr=127.0.0.1:9876"},
	{"metrics.port", "metrics.port=19876", "--metrics-addr=0.0.0.0:19876"},
	{"health.port", "health.port=19877", "--health-addr=127.0.0.1:19877"},
	{"health.bindAddress", "health.bindAddress=10.0.0.7", "--health-addr=10.0.0.7:9877"},
	{"maxSockets", "maxSockets=262144", "--max-sockets=262144"},
	{"maxPairs", "maxPairs=4096", "--max-pairs=4096"},
	{"maxUnread", "maxUnread=1048576", "--max-unread=1048576"},
	{"takeoverTimeout", "takeoverTimeout=90s", "--takeover-timeout=90s"},
	{"pairMaxAge", "pairMaxAge=2m", "--pair-max-age=2m"},
	{"ipv6", "ipv6=false", "--ipv6=false"},
	{"adoption.enabled", "adoption.enabled=true", "--adopt=true"},
	{"adoption.interval", "adoption.enabled=true,adoption.interval=1m", "--adopt-interval=1m"},
	{"traffic.includePorts", "traffic.includePorts={80,443}", "--include-ports=80,443"},
	{"traffic.excludePorts", "traffic.excludePorts={22}", "--exclude-ports=22"},
	{"traffic.includeCIDRs", "traffic.includeCIDRs={10.0.0.0/8,fd00::/8}", "--include-cidrs=10.0.0.0/8,fd00::/8"},
	{"traffic.excludeCIDRs", "traffic.excludeCIDRs={10.96.0.0/12}", "--exclude-cidrs=10.96.0.0/12"},
	{"log.level", "log.level=debug", "--log-level=debug"},
	{"log.format", "log.format=text", "--log-format=text"},
	{"extraArgs", "extraArgs={--max-pairs=1}", "--max-pairs=1"},
	{"bypass", "bypass=off", "--bypass=off"},
	{"bypass", "bypass=on", "--bypass=on"},
	{"bypass", "bypass=auto", "--bypass=auto"},
	{"bypassUDP", "bypassUDP=false", "--bypass-udp=false"},
	{"bypassIPv6", "bypassIPv6=false", "--bypass-ipv6=false"},
	{"bypassRecheck", "bypassRecheck=0", "--bypass-recheck=0"},
	{"closeResetDevices", "closeResetDevices=covered", "--close-reset-devices=covered"},
	{"services.enabled", "services.enabled=true", "--services"},
	{"services.nodePort.enabled", "services.enabled=true,services.nodePort.enabled=true", "--nodeport"},
	{"services.nodePort.devices", "services.enabled=true,services.nodePort.enabled=true,services.nodePort.devices={eth0,eth1}", "--nodeport-devices=eth0,eth1"},
	{"services.nodePort.healthCheckAddresses", "services.enabled=true,services.nodePort.enabled=true,services.nodePort.healthCheckAddresses={10.0.0.1}", "--nodeport-healthcheck-addresses=10.0.0.1"},
}

// Values that are not agent flags (Kubernetes settings of the pod).
var podValues = []string{"image.", "imagePullSecrets", "nameOverride", "fullnameOverride", "metrics.serviceMonitor.",
	"capabilities", "seccompProfile", "appArmorProfile", "resources.", "tolerations", "nodeSelector.", "affinity",
	"priorityClassName", "updateStrategy.", "terminationGracePeriodSeconds", "podAnnotations", "podLabels",
	"serviceAccount.", "extraEnv", "podSecurityContext", "seLinuxOptions", "commonLabels", "commonAnnotations",
	"k8sServiceHost", "k8sServicePort", "extraVolumes", "extraVolumeMounts", "extraInitContainers",
	"readinessProbe.", "livenessProbe.", "startupProbe.", "dashboards.", "prometheusRule."}

// The flags the chart always passes.
var fixedFlags = []string{"--kubernetes", "--node-name", "--takeover", "--uninstall-on-removal"}

// pendingFlags are Kubernetes-mode flags of the agent (issue #11) the chart
// passes before the agent has them: reported, not failed. Once `eztunnel run
// --help` lists them all, this list should be emptied.
var pendingFlags = map[string]bool{"--node-name": true, "--default-policy": true,
	"--pods-cgroup": true, "--cgroup2-root": true, "--cgroup-driver": true, "--uninstall-on-removal": true}

// valuePaths are values.yaml's settings as dotted paths.
func valuePaths(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values obj
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	var paths []string
	leaves("", values, &paths)
	return paths
}

// leaves lists values.yaml's settings as dotted paths.
func leaves(prefix string, v any, out *[]string) {
	if m, ok := v.(obj); ok && len(m) > 0 {
		for k, x := range m {
			leaves(prefix+k+".", x, out)
		}
		return
	}
	*out = append(*out, strings.TrimSuffix(prefix, "."))
}

// TestChartFlags: every value of values.yaml is either a pod setting or
// becomes the agent argument it documents, and every argument the chart
// passes is a flag `eztunnel run` accepts (the agent built from this tree).
func TestChartFlags(t *testing.T) {
	paths := valuePaths(t)
	for _, p := range paths {
		covered := slices.ContainsFunc(valueFlags, func(v struct{ value, set, arg string }) bool { return v.value == p }) ||
			slices.ContainsFunc(podValues, func(pv string) bool { return p == pv || strings.HasPrefix(p, pv) })
		if !covered {
			t.Errorf("values.yaml %s: neither mapped to an agent flag in valueFlags nor listed in podValues", p)
		}
	}

	args := func(docs []obj) []string { return strs(container(t, docs)["args"]) }
	all := map[string]bool{}
	for _, a := range args(render(t)) {
		all[a] = true
	}
	for _, f := range fixedFlags {
		if !slices.ContainsFunc(args(render(t)), func(a string) bool { return a == f || strings.HasPrefix(a, f+"=") }) {
			t.Errorf("the chart does not pass %s", f)
		}
	}
	for _, v := range valueFlags {
		got := args(render(t, v.set))
		if !slices.Contains(got, v.arg) {
			t.Errorf("--set %s: args %q lack %q", v.set, got, v.arg)
		}
		for _, a := range got {
			all[a] = true
		}
	}

	help, err := sysexec.Command(t.Context(), agent(t), "run", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("eztunnel run --help: %v\n%s", err, help)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?(--[a-z0-9-]+)`).FindAllStringSubmatch(string(help), -1) {
		known[m[1]] = true
	}
	if !known["--pin-path"] || !known["--log-level"] {
		t.Fatalf("could not read the flags from `eztunnel run --help`:\n%s", help)
	}
	unknown, pending := sortFlags(all, known)
	for _, a := range unknown {
		t.Errorf("the chart passes %s, which `eztunnel run` does not accept", a)
	}
	// The check itself: a made-up flag is caught.
	if u, _ := sortFlags(map[string]bool{"--no-such-flag=1": true, "--pin-path=/x": true}, known); !reflect.DeepEqual(u, []string{"--no-such-flag=1"}) {
		t.Errorf("sortFlags missed a made-up flag: %v", u)
	}
	for f := range pendingFlags {
		if known[f] {
			t.Logf("%s is in the agent now: drop it from pendingFlags", f)
		}
	}
	if len(pending) > 0 {
		t.Logf("flags the chart passes that the agent does not have yet (issue #11): %s", strings.Join(pending, " "))
	}
}

// sortFlags splits arguments into those no agent flag accepts and the
// pending flags among them (deduplicated, sorted).
func sortFlags(args, known map[string]bool) (unknown, pending []string) {
	seen := map[string]bool{}
	for a := range args {
		if a == "run" {
			continue
		}
		flag, _, _ := strings.Cut(a, "=")
		switch {
		case known[flag]:
		case pendingFlags[flag]:
			if !seen[flag] {
				seen[flag] = true
				pending = append(pending, flag)
			}
		default:
			unknown = append(unknown, a)
		}
	}
	sort.Strings(unknown)
	sort.Strings(pending)
	return unknown, pending
}

// image.digest pins the image by content: repository:tag@digest.
func TestChartDigest(t *testing.T) {
	d := "sha256:" + strings.Repeat("ab", 32)
	c := container(t, render(t, "image.repository=registry.local/ez", "image.tag=v1", "image.digest="+d))
	if img, _ := get(c, "image").(string); img != "registry.local/ez:v1@"+d {
		t.Fatalf("image %q, want registry.local/ez:v1@%s", img, d)
	}
}

// A numeric tag (`--set image.tag=2`, which helm parses as a number) still
// names the image repository:2.
func TestChartNumericTag(t *testing.T) {
	c := container(t, render(t, "image.repository=registry.local/ez", "image.tag=2"))
	if img, _ := get(c, "image").(string); img != "registry.local/ez:2" {
		t.Fatalf("image %q, want registry.local/ez:2", img)
	}
}

// documentedRow: the value has a row, or its nearest ancestor has (a
// free-form object such as resources, whose default shows its keys).
func documentedRow(rows map[string]bool, segs []string) bool {
	for i := len(segs); i > 0; i-- {
		if rows[strings.Join(segs[:i], ".")] {
			return true
		}
	}
	return false
}

// TestChartValuesDocumented: every value of values.yaml has its row (or, in a
// free-form object such as resources, its object has) in the
// values reference (docs/reference/chart-values.md, generated by `make
// reference`), read back from the page, and the page names no value
// values.yaml and the schema do not have: a new value cannot ship
// undocumented, nor a removed one stay documented.
func TestChartValuesDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "reference", "chart-values.md"))
	if err != nil {
		t.Fatal(err)
	}
	paths := valuePaths(t)
	if len(paths) < 30 {
		t.Fatalf("%d values found: values.yaml's layout changed?", len(paths))
	}
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Za-z0-9_.]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		rows[m[1]] = true
	}
	have := map[string]bool{"global": true} // the schema's, set by a parent chart
	for _, p := range paths {
		segs := strings.Split(p, ".")
		for i := 1; i <= len(segs); i++ {
			have[strings.Join(segs[:i], ".")] = true
		}
		if !documentedRow(rows, segs) {
			t.Errorf("values.yaml %s has no row in docs/reference/chart-values.md: run make reference", p)
		}
	}
	// Keys only the schema describes (podSecurityContext.fsGroup) are values too.
	sraw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema schemaNode
	if err := json.Unmarshal(sraw, &schema); err != nil {
		t.Fatal(err)
	}
	var walk func(prefix string, n *schemaNode)
	walk = func(prefix string, n *schemaNode) {
		for k, sub := range n.Properties {
			have[prefix+k] = true
			walk(prefix+k+".", sub)
		}
	}
	walk("", &schema)
	for r := range rows {
		if !have[r] {
			t.Errorf("docs/reference/chart-values.md has a row for %s, which neither values.yaml nor its schema has: run make reference", r)
		}
	}
}
