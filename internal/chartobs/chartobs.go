// Package chartobs reads the Helm chart's observability objects, the
// Grafana dashboard's ConfigMap and the PrometheusRule, from a rendering,
// and checks their queries: Prometheus' own parser (tools/promql) parses
// each and names the metrics it selects. The chart's tests use it
// (deploy: the objects load and parse; test/e2e: every metric they name is
// in a live agent's /metrics).
package chartobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/internal/toolbin"
)

// KubeStateMetrics are the metrics of kube-state-metrics the dashboard and
// the alerts read (the agent pods' restarts and readiness): the only names
// not of the agent.
var KubeStateMetrics = []string{"kube_pod_container_status_restarts_total", "kube_pod_status_ready"}

// WantFamilies are agent metrics the dashboard and the alerts must name:
// parts enabled, pairs and accelerated connections, fallbacks, map fill,
// the bypass and the Service load balancer (deploy checks they are
// selected, test/e2e that each is in a live /metrics).
var WantFamilies = []string{"eztunnel_feature_enabled", "eztunnel_bypass_enabled", "eztunnel_datapath_up", "eztunnel_agent_info",
	"eztunnel_pairs_total", "eztunnel_bytes_redirected_total", "eztunnel_fallbacks_total", "eztunnel_map_entries", "eztunnel_map_max_entries",
	"eztunnel_bypass_bytes_total", "eztunnel_bypass_fallbacks_total", "eztunnel_bypass_devices", "eztunnel_bypass_idle_devices",
	"eztunnel_services_translations_total", "eztunnel_services_failures_total", "eztunnel_services_frontends", "eztunnel_services_sync_seconds"}

// Enable are the --set arguments that render both objects.
var Enable = []string{"dashboards.enabled=true", "prometheusRule.enabled=true"}

// Render is `helm template` of the chart (deploy/helm/eztunnel under repo)
// into kube-system with both objects enabled and set applied.
func Render(ctx context.Context, repo string, set ...string) ([]byte, error) {
	helm, err := toolbin.Build(ctx, repo, "helm")
	if err != nil {
		return nil, err
	}
	args := []string{"template", "eztunnel", filepath.Join(repo, "deploy", "helm", "eztunnel"), "--namespace", "kube-system"}
	for _, s := range append(slices.Clone(Enable), set...) {
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := sysexec.Command(ctx, helm, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %v: %w: %s", args, err, stderr.String())
	}
	return out, nil
}

// Rule is one alerting rule of the PrometheusRule.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// Objects are the observability objects of a rendering.
type Objects struct {
	// DashboardJSON is the ConfigMap's dashboard, as rendered; Dashboard
	// the same, decoded.
	DashboardJSON string
	Dashboard     map[string]any
	// ConfigMap is the dashboard's ConfigMap's metadata.
	ConfigMap map[string]any
	// Rule is the PrometheusRule's metadata; Rules its alerts.
	Rule  map[string]any
	Rules []Rule
}

// Extract finds the dashboard's ConfigMap and the PrometheusRule in a
// rendering: an error when either is missing or does not decode.
func Extract(rendered []byte) (*Objects, error) {
	o := &Objects{}
	dec := yaml.NewDecoder(bytes.NewReader(rendered))
	for {
		var d struct {
			Kind     string            `yaml:"kind"`
			Metadata map[string]any    `yaml:"metadata"`
			Data     map[string]string `yaml:"data"`
			Spec     struct {
				Groups []struct {
					Rules []Rule `yaml:"rules"`
				} `yaml:"groups"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decoding the rendering: %w", err)
		}
		switch d.Kind {
		case "ConfigMap":
			js, ok := d.Data["eztunnel.json"]
			if !ok {
				continue
			}
			o.DashboardJSON, o.ConfigMap = js, d.Metadata
			if err := json.Unmarshal([]byte(js), &o.Dashboard); err != nil {
				return nil, fmt.Errorf("the dashboard's JSON: %w", err)
			}
		case "PrometheusRule":
			o.Rule = d.Metadata
			for _, g := range d.Spec.Groups {
				o.Rules = append(o.Rules, g.Rules...)
			}
		}
	}
	if o.Dashboard == nil || o.Rule == nil {
		return nil, fmt.Errorf("the rendering lacks the dashboard's ConfigMap (%v) or the PrometheusRule (%v)", o.Dashboard != nil, o.Rule != nil)
	}
	return o, nil
}

// labelValues is Grafana's label_values(<selector>, <label>) variable query.
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

// Queries lists every query of the dashboard: each panel target's expr and
// each query variable's (the selector of a label_values).
func (o *Objects) Queries() []string {
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if e, ok := x["expr"].(string); ok {
				out = append(out, e)
			}
			for k, y := range x {
				if k != "templating" {
					walk(y)
				}
			}
		case []any:
			for _, y := range x {
				walk(y)
			}
		}
	}
	walk(o.Dashboard["panels"])
	vars, _ := o.Dashboard["templating"].(map[string]any)
	list, _ := vars["list"].([]any)
	for _, v := range list {
		m, _ := v.(map[string]any)
		if m["type"] != "query" {
			continue
		}
		q, _ := m["query"].(map[string]any)
		s, _ := q["query"].(string)
		if sm := labelValues.FindStringSubmatch(s); sm != nil {
			s = sm[1]
		}
		out = append(out, s)
	}
	return out
}

// grafanaVars are Grafana's variables in a query.
var grafanaVars = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?`)

// PromQL is a dashboard query as Prometheus gets it: Grafana's interval
// variables a duration, other variables a regular expression matching all.
func PromQL(q string) string {
	return grafanaVars.ReplaceAllStringFunc(q, func(v string) string {
		if strings.HasPrefix(v, "$__") {
			return "5m"
		}
		return ".*"
	})
}

// Parsed is one expression through Prometheus' parser.
type Parsed struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics"`
	Error   string   `json:"error"`
}

// Parse runs Prometheus' parser (tools/promql) over exprs.
func Parse(ctx context.Context, repo string, exprs []string) ([]Parsed, error) {
	bin, err := toolbin.Build(ctx, repo, "promql")
	if err != nil {
		return nil, err
	}
	var in bytes.Buffer
	for _, e := range exprs {
		b, _ := json.Marshal(e)
		in.Write(append(b, '\n'))
	}
	cmd := sysexec.Command(ctx, bin)
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit interface{ ExitCode() int }
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return nil, fmt.Errorf("promql: %w: %s", err, stderr.String())
	}
	var res []Parsed
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p Parsed
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("promql's output: %w", err)
		}
		res = append(res, p)
	}
	if len(res) != len(exprs) {
		return nil, fmt.Errorf("promql answered %d of %d expressions", len(res), len(exprs))
	}
	return res, nil
}

// agentName is a name of the agent's metrics, anywhere in a text.
var agentName = regexp.MustCompile(`\beztunnel_[a-z0-9_]+`)

// Families lists the agent's metric families a text names (identifiers
// eztunnel_*; a histogram's _bucket, _sum and _count series are its
// family), sorted and deduplicated.
func Families(texts ...string) []string {
	var out []string
	for _, t := range texts {
		for _, n := range agentName.FindAllString(t, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, suffix); ok {
					n = b
					break
				}
			}
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
