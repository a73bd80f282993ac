package deploy

import (
	"reflect"
	"slices"
	"testing"
)

// envOf is the agent container's env as name: value (literal values only).
func envOf(c obj) map[string]any {
	env := map[string]any{}
	for _, e := range c["env"].([]any) {
		if v, ok := e.(obj)["value"]; ok {
			env[e.(obj)["name"].(string)] = v
		}
	}
	return env
}

// named finds the item of a list of objects with that name.
func named(list any, name string) obj {
	l, _ := list.([]any)
	for _, x := range l {
		if m, ok := x.(obj); ok && m["name"] == name {
			return m
		}
	}
	return nil
}

// TestChartPodValues: each pod setting renders where Kubernetes reads it,
// and only when given (the defaults render as before: TestManifestCommitted
// compares them with the committed manifest, TestChartLeastPrivilege the
// env, volumes and probes).
func TestChartPodValues(t *testing.T) {
	docs := render(t)
	c := container(t, docs)
	pod := get(daemonSet(t, docs), "spec", "template", "spec").(obj)
	if pod["securityContext"] != nil || pod["initContainers"] != nil || c["startupProbe"] != nil || get(c, "securityContext", "seLinuxOptions") != nil {
		t.Errorf("defaults: pod securityContext %v, initContainers %v, startupProbe %v, seLinuxOptions %v",
			pod["securityContext"], pod["initContainers"], c["startupProbe"], get(c, "securityContext", "seLinuxOptions"))
	}
	// Today's probe timing, unchanged.
	for probe, want := range map[string]obj{
		"livenessProbe":  {"initialDelaySeconds": 5, "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3},
		"readinessProbe": {"periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 3},
	} {
		got := obj{}
		for k, v := range c[probe].(obj) {
			if k != "exec" {
				got[k] = v
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s timing %v, want %v", probe, got, want)
		}
	}

	docs = render(t, "k8sServiceHost=10.0.0.1", "k8sServicePort=6443", "seLinuxOptions.type=spc_t", "podSecurityContext.fsGroup=0",
		"extraVolumes[0].name=ca", "extraVolumes[0].configMap.name=ca-bundle",
		"extraVolumeMounts[0].name=ca", "extraVolumeMounts[0].mountPath=/etc/ca", "extraVolumeMounts[0].readOnly=true",
		"extraInitContainers[0].name=wait", "extraInitContainers[0].image=busybox:1",
		"readinessProbe.periodSeconds=5", "readinessProbe.initialDelaySeconds=1", "livenessProbe.timeoutSeconds=7",
		"startupProbe.enabled=true", "startupProbe.failureThreshold=90")
	c = container(t, docs)
	pod = get(daemonSet(t, docs), "spec", "template", "spec").(obj)
	if env := envOf(c); env["KUBERNETES_SERVICE_HOST"] != "10.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("k8sServiceHost/Port: env %v", env)
	}
	if get(c, "securityContext", "seLinuxOptions", "type") != "spc_t" || get(c, "securityContext", "runAsUser") != 0 {
		t.Errorf("seLinuxOptions: container securityContext %v", c["securityContext"])
	}
	if get(pod, "securityContext", "fsGroup") != 0 {
		t.Errorf("podSecurityContext: %v", pod["securityContext"])
	}
	if get(named(pod["volumes"], "ca"), "configMap", "name") != "ca-bundle" || named(pod["volumes"], "bpffs") == nil {
		t.Errorf("extraVolumes: %v", pod["volumes"])
	}
	if m := named(c["volumeMounts"], "ca"); m["mountPath"] != "/etc/ca" || m["readOnly"] != true || named(c["volumeMounts"], "lock") == nil {
		t.Errorf("extraVolumeMounts: %v", c["volumeMounts"])
	}
	if get(named(pod["initContainers"], "wait"), "image") != "busybox:1" {
		t.Errorf("extraInitContainers: %v", pod["initContainers"])
	}
	if r := c["readinessProbe"].(obj); r["periodSeconds"] != 5 || r["initialDelaySeconds"] != 1 || r["timeoutSeconds"] != 3 {
		t.Errorf("readinessProbe %v", r)
	}
	if l := c["livenessProbe"].(obj); l["timeoutSeconds"] != 7 || l["initialDelaySeconds"] != 5 {
		t.Errorf("livenessProbe %v", l)
	}
	sp, _ := c["startupProbe"].(obj)
	if !reflect.DeepEqual(get(sp, "exec", "command"), get(c, "livenessProbe", "exec", "command")) || sp["failureThreshold"] != 90 || sp["periodSeconds"] != 2 {
		t.Errorf("startupProbe %v", sp)
	}
}

// TestChartCommonMetadata: commonLabels and commonAnnotations are on every
// object the chart renders, with everything enabled, beside each object's
// own (serviceAccount.annotations, metrics.serviceMonitor.labels, the
// dashboard's sidecar label and annotations, prometheusRule.labels).
func TestChartCommonMetadata(t *testing.T) {
	docs := render(t, "commonLabels.team=net", "commonAnnotations.owner=me", "metrics.serviceMonitor.enabled=true",
		"metrics.serviceMonitor.labels.release=prom", "dashboards.enabled=true", "dashboards.annotations.folder=net",
		"prometheusRule.enabled=true", "prometheusRule.labels.role=alerts", "serviceAccount.annotations.iam=x", "services.enabled=true")
	var ks []string
	for _, d := range docs {
		k, _ := d["kind"].(string)
		ks = append(ks, k)
		if get(d, "metadata", "labels", "team") != "net" || get(d, "metadata", "labels", "app.kubernetes.io/name") != "eztunnel" {
			t.Errorf("%s labels %v", k, get(d, "metadata", "labels"))
		}
		if get(d, "metadata", "annotations", "owner") != "me" {
			t.Errorf("%s annotations %v", k, get(d, "metadata", "annotations"))
		}
	}
	slices.Sort(ks)
	want := []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "PrometheusRule", "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor"}
	if !reflect.DeepEqual(ks, want) {
		t.Errorf("rendered %v, want %v", ks, want)
	}
	byKind := kinds(docs)
	for _, c := range []struct {
		kind, field, key, want string
	}{
		{"ServiceAccount", "annotations", "iam", "x"},
		{"ServiceMonitor", "labels", "release", "prom"},
		{"ConfigMap", "labels", "grafana_dashboard", "1"},
		{"ConfigMap", "annotations", "folder", "net"},
		{"PrometheusRule", "labels", "role", "alerts"},
	} {
		if got := get(byKind[c.kind][0], "metadata", c.field, c.key); got != c.want {
			t.Errorf("%s %s %s = %v, want %s", c.kind, c.field, c.key, got, c.want)
		}
	}
	// Not the pods: those are podLabels' and podAnnotations'.
	if get(daemonSet(t, docs), "spec", "template", "metadata", "labels", "team") != nil {
		t.Error("commonLabels on the pod template")
	}
	// The dashboard where the sidecar looks.
	cm := kinds(render(t, "dashboards.enabled=true", "dashboards.namespace=monitoring", "dashboards.label=dash", "dashboards.labelValue=yes"))["ConfigMap"]
	if len(cm) != 1 || get(cm[0], "metadata", "namespace") != "monitoring" || get(cm[0], "metadata", "labels", "dash") != "yes" {
		t.Errorf("dashboards.namespace/label: %v", cm)
	}
}
