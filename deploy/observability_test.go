package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/chartobs"
)

// wantAlerts are the PrometheusRule's alerts, each documented under its
// own heading in docs/monitoring.md (the runbook_url's anchor).
var wantAlerts = []string{"EztunnelDatapathNotReady", "EztunnelMapNearlyFull", "EztunnelFallbacksRising", "EztunnelAgentRestarts"}

// TestChartDashboardAndRules: with dashboards.enabled and
// prometheusRule.enabled the chart renders a ConfigMap whose dashboard
// JSON loads, has panels each with queries, and a PrometheusRule with the
// four alerts, each with a severity, a description and a runbook_url to an
// existing heading; Prometheus' parser (tools/promql) parses every query
// and expression, and the metrics they select are the agent's (the ones
// expected among them) or kube-state-metrics' listed ones.
func TestChartDashboardAndRules(t *testing.T) {
	rendered, err := chartobs.Render(t.Context(), repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	o, err := chartobs.Extract(rendered)
	if err != nil {
		t.Fatal(err)
	}
	checkDashboard(t, o)
	checkRules(t, o)

	queries := o.Queries()
	for _, r := range o.Rules {
		queries = append(queries, r.Expr)
	}
	var exprs []string
	for _, q := range queries {
		exprs = append(exprs, chartobs.PromQL(q))
	}
	parsed, err := chartobs.Parse(t.Context(), repoRoot(t), exprs)
	if err != nil {
		t.Fatal(err)
	}
	var selected []string
	for _, p := range parsed {
		if p.Error != "" {
			t.Errorf("%q does not parse: %s", p.Expr, p.Error)
		}
		if len(p.Metrics) == 0 && !strings.HasPrefix(p.Expr, "vector(") {
			t.Errorf("%q selects no metric", p.Expr)
		}
		selected = append(selected, p.Metrics...)
	}
	var agentSel []string
	for _, m := range selected {
		if strings.HasPrefix(m, "eztunnel_") {
			agentSel = append(agentSel, m)
		} else if !slices.Contains(chartobs.KubeStateMetrics, m) {
			t.Errorf("the dashboard or the alerts select %s: neither the agent's nor a listed kube-state-metrics metric", m)
		}
	}
	fams := chartobs.Families(strings.Join(agentSel, " "))
	for _, w := range chartobs.WantFamilies {
		if !slices.Contains(fams, w) {
			t.Errorf("no query selects %s (selected: %v)", w, fams)
		}
	}
	// Every eztunnel_* name in the text is a selected metric (the e2e
	// check reads the text): no name only in a description.
	for _, f := range chartobs.Families(o.DashboardJSON, strings.Join(queries, "\n")) {
		if !slices.Contains(fams, f) {
			t.Errorf("the dashboard names %s, which no query selects", f)
		}
	}
	// The parser is live: it refuses what is not PromQL.
	bad, err := chartobs.Parse(t.Context(), repoRoot(t), []string{"sum(rate(eztunnel_pairs_total[5m])", "eztunnel_map_entries{map=sockets}", "rat(eztunnel_pairs_total[5m])"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range bad {
		if p.Error == "" {
			t.Errorf("the parser accepts %q", p.Expr)
		}
	}
}

// checkDashboard: the ConfigMap carries the sidecar's label; the dashboard
// has a title, a uid, the datasource variable and panels with queries, and
// no placeholder is left.
func checkDashboard(t *testing.T, o *chartobs.Objects) {
	t.Helper()
	labels, _ := o.ConfigMap["labels"].(map[string]any)
	if labels["grafana_dashboard"] != "1" || o.ConfigMap["namespace"] != "kube-system" {
		t.Errorf("dashboard ConfigMap metadata %v", o.ConfigMap)
	}
	if o.Dashboard["title"] == "" || o.Dashboard["uid"] == "" || !strings.Contains(o.DashboardJSON, `"${datasource}"`) {
		t.Errorf("dashboard title %v, uid %v, or no datasource variable", o.Dashboard["title"], o.Dashboard["uid"])
	}
	if strings.Contains(o.DashboardJSON, "__EZTUNNEL_") {
		t.Error("a placeholder is left in the rendered dashboard")
	}
	panels, _ := o.Dashboard["panels"].([]any)
	withQueries := 0
	for _, p := range panels {
		m := p.(map[string]any)
		if m["type"] == "row" {
			continue
		}
		targets, _ := m["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no targets", m["title"])
		}
		for _, tg := range targets {
			if e, _ := tg.(map[string]any)["expr"].(string); strings.TrimSpace(e) == "" {
				t.Errorf("panel %q has a target without expr", m["title"])
			}
		}
		if m["gridPos"] == nil || m["title"] == "" {
			t.Errorf("panel %v lacks a title or a gridPos", m["title"])
		}
		withQueries++
	}
	if withQueries < 15 {
		t.Errorf("%d panels with queries, want at least 15", withQueries)
	}
}

// headingAnchor is GitHub's anchor of a Markdown heading.
func headingAnchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// checkRules: the four alerts, each with a severity, a summary, a
// description and a runbook_url whose anchor is a heading of the page.
func checkRules(t *testing.T, o *chartobs.Objects) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[headingAnchor(m[1])] = true
	}
	var alerts []string
	for _, r := range o.Rules {
		alerts = append(alerts, r.Alert)
		if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" {
			t.Errorf("%s: severity %q", r.Alert, sev)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: annotations %v", r.Alert, r.Annotations)
		}
		page, anchor, ok := strings.Cut(r.Annotations["runbook_url"], "#")
		if !ok || !strings.HasSuffix(page, "/docs/monitoring.md") || !anchors[anchor] {
			t.Errorf("%s: runbook_url %q is not a heading of docs/monitoring.md", r.Alert, r.Annotations["runbook_url"])
		}
		if strings.TrimSpace(r.Expr) == "" {
			t.Errorf("%s: no expr", r.Alert)
		}
	}
	if !slices.Equal(alerts, wantAlerts) {
		t.Errorf("alerts %v, want %v", alerts, wantAlerts)
	}
	for _, r := range o.Rules {
		if strings.Contains(r.Expr, "kube_pod") && !strings.Contains(r.Expr, `pod=~"eztunnel-[a-z0-9]{5}"`) {
			t.Errorf("%s: kube-state-metrics not filtered to the DaemonSet's pods: %s", r.Alert, r.Expr)
		}
	}
}
