package kube

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

func TestParsePolicyAndValidate(t *testing.T) {
	for _, s := range []string{"enabled", "disabled"} {
		if p, err := ParsePolicy(s); err != nil || string(p) != s {
			t.Errorf("ParsePolicy(%q) = %q, %v", s, p, err)
		}
	}
	for _, s := range []string{"", "on", "Enabled", "true"} {
		if _, err := ParsePolicy(s); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
			t.Errorf("ParsePolicy(%q): err = %v, want an error naming the value", s, err)
		}
	}
	ok := Config{NodeName: "n1"}
	if err := ok.Validate(); err != nil {
		t.Errorf("minimal config: %v", err)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "node name is empty"},
		{Config{NodeName: "n1", Default: "maybe"}, `default policy "maybe"`},
		{Config{NodeName: "n1", Driver: "cgroupv1"}, `cgroup driver "cgroupv1"`},
		{Config{NodeName: "n1", Driver: "Systemd"}, `cgroup driver "Systemd"`},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
	// Every problem at once, each named.
	err := Config{Default: "x", Driver: "y"}.Validate()
	for _, want := range []string{"node name", `"x"`, `"y"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate with three problems = %v, want %q in it", err, want)
		}
	}
	// Run and PodsRoot refuse a bad config before touching anything.
	if _, err := PodsRoot(Config{NodeName: "n1", Driver: "bogus"}); err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Errorf("PodsRoot with a bad driver: %v", err)
	}
	if err := Run(t.Context(), Config{Default: "on"}, nil, nil); err == nil || !strings.Contains(err.Error(), `"on"`) {
		t.Errorf("Run with a bad policy: %v", err)
	}
}

// TestPolicyTable checks every combination of pod annotation, namespace
// labels (Key and OptInKey), default policy and pod kind against the rules in
// the contract (docs/kubernetes.md, "Select workloads").
func TestPolicyTable(t *testing.T) {
	annotations := []string{"", "enabled", "disabled", "bogus"} // "" = absent
	labels := []string{"", "enabled", "disabled", "Enabled", "<no namespace>"}
	optIns := []string{"", "enabled", "disabled", "yes"}
	kinds := []string{"plain", "hostNetwork", "self"}
	n := 0
	for _, def := range []Policy{Enabled, Disabled, ""} {
		for _, ann := range annotations {
			for _, lab := range labels {
				for _, optIn := range optIns {
					for _, kind := range kinds {
						var logs bytes.Buffer
						cfg := Config{NodeName: "n", Default: def, SelfUID: "self-uid",
							Logger: slog.New(slog.NewTextHandler(&logs, nil))}
						p := newPolicy(cfg)
						pod := &kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid"}}
						if ann != "" {
							pod.Annotations = map[string]string{Key: ann, "other": "x"}
						}
						switch kind {
						case "hostNetwork":
							pod.Spec.HostNetwork = true
						case "self":
							pod.UID = "self-uid"
						}
						var ns *kubeapi.Namespace
						if lab != "<no namespace>" {
							ns = &kubeapi.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{}}}
							if lab != "" {
								ns.Labels[Key] = lab
							}
							if optIn != "" {
								ns.Labels[OptInKey] = optIn
							}
						}
						// The rules, spelled out independently of decide's code:
						// the operator decides, a pod only narrows.
						var want bool
						switch {
						case kind != "plain": // host network, the agent: never
							want = false
						case lab == "disabled": // the namespace's no is final
							want = false
						case ann == "disabled": // opting out is always allowed
							want = false
						case ann == "enabled" && optIn == "enabled" && ns != nil: // opt-in allowed
							want = true
						case lab == "enabled":
							want = true
						default:
							want = def == Enabled
						}
						name := fmt.Sprintf("default=%q/annotation=%q/label=%q/opt-in=%q/%s", def, ann, lab, optIn, kind)
						for range 3 { // repeated: still one warning per invalid value
							if got := p.decide(pod, ns); got.Selected != want {
								t.Errorf("%s: selected=%v (%s), want %v", name, got.Selected, got.Reason, want)
							}
						}
						// Each invalid value is logged once, when it is read: nothing
						// is read of host-network pods and the agent; the annotation
						// is not read in a disabled namespace; the opt-in label only
						// for a pod that asks.
						wantWarn := 0
						if kind == "plain" && ns != nil && lab == "Enabled" {
							wantWarn++
						}
						if kind == "plain" && lab != "disabled" && ann == "bogus" {
							wantWarn++
						}
						if kind == "plain" && ns != nil && lab != "disabled" && ann == "enabled" && optIn == "yes" {
							wantWarn++
						}
						if got := strings.Count(logs.String(), "level=WARN"); got != wantWarn {
							t.Errorf("%s: %d warnings, want %d:\n%s", name, got, wantWarn, logs.String())
						}
						if kind == "plain" && lab != "disabled" && ann == "bogus" && !strings.Contains(logs.String(), "object=\"pod ns/p\"") {
							t.Errorf("%s: warning does not name the pod:\n%s", name, logs.String())
						}
						if wantWarn > 0 && lab == "Enabled" && !strings.Contains(logs.String(), "object=\"namespace ns\" key=eztunnel.io/shortcut value=Enabled") {
							t.Errorf("%s: warning does not name the namespace:\n%s", name, logs.String())
						}
						if wantWarn > 0 && optIn == "yes" && ann == "enabled" && !strings.Contains(logs.String(), "key=eztunnel.io/shortcut-opt-in value=yes") {
							t.Errorf("%s: warning does not name the opt-in label:\n%s", name, logs.String())
						}
						n++
					}
				}
			}
		}
	}
	if n != 3*4*5*4*3 {
		t.Fatalf("checked %d combinations", n)
	}
}

// TestPolicyPodCannotOverrideOperator plays the tenant: a pod annotates
// itself enabled where the operator said no, or did not say yes.
func TestPolicyPodCannotOverrideOperator(t *testing.T) {
	p := newPolicy(Config{NodeName: "n", SelfUID: "self-uid", Logger: slog.New(slog.DiscardHandler)})
	asks := map[string]string{Key: "enabled"}
	namespace := func(labels map[string]string) *kubeapi.Namespace {
		return &kubeapi.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: labels}}
	}
	for _, c := range []struct {
		name string
		pod  kubeapi.Pod
		ns   *kubeapi.Namespace
		want bool
	}{
		{"annotated enabled in a namespace labelled disabled", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: asks}},
			namespace(map[string]string{Key: "disabled"}), false},
		{"annotated enabled in a namespace labelled disabled that allows opt-in", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: asks}},
			namespace(map[string]string{Key: "disabled", OptInKey: "enabled"}), false},
		{"host-network pod annotated enabled in an enabled namespace", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: asks}, Spec: kubeapi.PodSpec{HostNetwork: true}},
			namespace(map[string]string{Key: "enabled", OptInKey: "enabled"}), false},
		{"the agent's pod annotated enabled", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{UID: "self-uid", Annotations: asks}},
			namespace(map[string]string{Key: "enabled", OptInKey: "enabled"}), false},
		{"annotated enabled in an unlabelled namespace (default disabled)", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: asks}},
			namespace(nil), false},
		{"annotated enabled, namespace not known", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: asks}}, nil, false},
		{"annotated enabled in a namespace that allows opt-in", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: asks}},
			namespace(map[string]string{OptInKey: "enabled"}), true},
		// The shortcut skips the veth the bandwidth plugin shapes: a shaped
		// pod, even one asking in an enabled namespace, is left out.
		{"shaped to ingress-bandwidth in an enabled namespace", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{Key: "enabled", "kubernetes.io/ingress-bandwidth": "10M"}}},
			namespace(map[string]string{Key: "enabled", OptInKey: "enabled"}), false},
		{"shaped to egress-bandwidth in an enabled namespace", kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"kubernetes.io/egress-bandwidth": "1G"}}},
			namespace(map[string]string{Key: "enabled"}), false},
	} {
		if got := p.decide(&c.pod, c.ns); got.Selected != c.want {
			t.Errorf("%s: selected=%v (%s), want %v", c.name, got.Selected, got.Reason, c.want)
		}
	}
}

func TestPolicyWarnsAgainOnNewValue(t *testing.T) {
	var logs bytes.Buffer
	p := newPolicy(Config{NodeName: "n", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ns := &kubeapi.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{Key: "yes"}}}
	pod := &kubeapi.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	p.decide(pod, ns)
	p.decide(pod, ns)
	ns.Labels[Key] = "no"
	p.decide(pod, ns)
	p.forget("namespace ns")
	p.decide(pod, ns)
	if got := strings.Count(logs.String(), "level=WARN"); got != 3 {
		t.Fatalf("%d warnings, want 3 (yes, no, no after forget):\n%s", got, logs.String())
	}
}
