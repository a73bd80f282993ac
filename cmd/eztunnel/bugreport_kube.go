package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"k8s.io/client-go/rest"

	"github.com/eztunnel/eztunnel/internal/kube"
)

// kubeFile is one file of a bug report's Kubernetes view.
type kubeFile struct {
	name string
	data []byte
	err  error
}

// errNotInPod: no $POD_NAMESPACE/$POD_NAME (the chart sets them from the
// downward API): not run in the agent's pod.
var errNotInPod = errors.New("not in the agent's pod ($POD_NAMESPACE and $POD_NAME unset), nothing asked")

// kubeView is the node's Kubernetes view for a bug report, as the API
// serves it to the agent's service account: the agent's pod, its
// DaemonSet, and the recent events of both. Raw JSON, as the API answers;
// each file that cannot be read carries why.
func kubeView(ctx context.Context, kubeconfig string) []kubeFile {
	ns, pod := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || pod == "" {
		return []kubeFile{{name: "kubernetes/pod.json", err: errNotInPod}}
	}
	rc, err := kube.RESTConfig(kube.Config{Kubeconfig: kubeconfig})
	if err != nil {
		return []kubeFile{{name: "kubernetes/pod.json", err: err}}
	}
	rc.Timeout = 10 * time.Second
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return []kubeFile{{name: "kubernetes/pod.json", err: err}}
	}
	get := func(path string, q url.Values) ([]byte, error) {
		u, err := url.Parse(rc.Host)
		if err != nil {
			return nil, err
		}
		u = u.JoinPath(path)
		u.RawQuery = q.Encode()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
		}
		return b, err
	}
	podJSON, err := get("/api/v1/namespaces/"+ns+"/pods/"+pod, nil)
	files := []kubeFile{{name: "kubernetes/pod.json", data: podJSON, err: err}}
	events := func(name string) kubeFile {
		b, err := get("/api/v1/namespaces/"+ns+"/events", url.Values{"fieldSelector": {"involvedObject.name=" + name}})
		return kubeFile{name: "kubernetes/events-" + name + ".json", data: b, err: err}
	}
	files = append(files, events(pod))
	if err != nil {
		return files
	}
	var p struct {
		Metadata struct {
			OwnerReferences []struct{ Kind, Name string } `json:"ownerReferences"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(podJSON, &p); err != nil {
		return append(files, kubeFile{name: "kubernetes/daemonset.json", err: err})
	}
	for _, o := range p.Metadata.OwnerReferences {
		if o.Kind == "DaemonSet" {
			b, err := get("/apis/apps/v1/namespaces/"+ns+"/daemonsets/"+o.Name, nil)
			return append(files, kubeFile{name: "kubernetes/daemonset.json", data: b, err: err}, events(o.Name))
		}
	}
	return append(files, kubeFile{name: "kubernetes/daemonset.json", err: fmt.Errorf("pod %s/%s has no DaemonSet owner", ns, pod)})
}
