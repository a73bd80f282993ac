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
// label, default policy and pod kind against the rules in the contract.
func TestPolicyTable(t *testing.T) {
	annotations := []string{"", "enabled", "disabled", "bogus"} // "" = absent
	labels := []string{"", "enabled", "disabled", "Enabled", "<no namespace>"}
	kinds := []string{"plain", "hostNetwork", "self"}
	n := 0
	for _, def := range []Policy{Enabled, Disabled, ""} {
		for _, ann := range annotations {
			for _, lab := range labels {
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
						ns = &kubeapi.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}
						if lab != "" {
							ns.Labels = map[string]string{Key: lab}
						}
					}
					// The rules, spelled out independently of decide's code.
					var want bool
					switch {
					case ann == "enabled":
						want = true
					case ann == "disabled":
						want = false
					case kind != "plain":
						want = false
					case lab == "enabled":
						want = true
					case lab == "disabled":
						want = false
					default:
						want = def == Enabled
					}
					name := fmt.Sprintf("default=%q/annotation=%q/label=%q/%s", def, ann, lab, kind)
					for range 3 { // repeated: still one warning per invalid object
						if got := p.decide(pod, ns); got.Selected != want {
							t.Errorf("%s: selected=%v (%s), want %v", name, got.Selected, got.Reason, want)
						}
					}
					wantWarn := 0
					if ann == "bogus" {
						wantWarn++
					}
					// The namespace label is read only when the annotation decides nothing
					// and the pod is neither host-network nor the agent.
					if lab == "Enabled" && ann != "enabled" && ann != "disabled" && kind == "plain" {
						wantWarn++
					}
					if got := strings.Count(logs.String(), "level=WARN"); got != wantWarn {
						t.Errorf("%s: %d warnings, want %d:\n%s", name, got, wantWarn, logs.String())
					}
					if ann == "bogus" && !strings.Contains(logs.String(), "object=\"pod ns/p\"") {
						t.Errorf("%s: warning does not name the pod:\n%s", name, logs.String())
					}
					if wantWarn > 0 && lab == "Enabled" && ann == "" && !strings.Contains(logs.String(), "object=\"namespace ns\"") {
						t.Errorf("%s: warning does not name the namespace:\n%s", name, logs.String())
					}
					n++
				}
			}
		}
	}
	if n != 3*4*5*3 {
		t.Fatalf("checked %d combinations", n)
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
