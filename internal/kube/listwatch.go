package kube

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// ListWatches are the list+watch endpoints informers need for the Service
// load balancer (Services, EndpointSlices, the node), on the REST clients
// of this package's trimmed scheme: the agent links no typed clientset.
type ListWatches struct {
	core, discovery *rest.RESTClient
}

// NewListWatches builds them on a REST configuration.
func NewListWatches(rc *rest.Config) (*ListWatches, error) {
	core, err := restClient(rc, kubeapi.CoreV1, "/api")
	if err != nil {
		return nil, err
	}
	disc, err := restClient(rc, kubeapi.DiscoveryV1, "/apis")
	if err != nil {
		return nil, err
	}
	return &ListWatches{core: core, discovery: disc}, nil
}

// Services of every namespace.
func (l *ListWatches) Services() cache.ListerWatcher {
	return cache.NewListWatchFromClient(l.core, "services", metav1.NamespaceAll, fields.Everything())
}

// EndpointSlices of every namespace.
func (l *ListWatches) EndpointSlices() cache.ListerWatcher {
	return cache.NewListWatchFromClient(l.discovery, "endpointslices", metav1.NamespaceAll, fields.Everything())
}

// Node is the one node named name (field selector metadata.name).
func (l *ListWatches) Node(name string) cache.ListerWatcher {
	return cache.NewListWatchFromClient(l.core, "nodes", metav1.NamespaceAll, fields.OneTermEqualSelector("metadata.name", name))
}

// restClient is a client of one group version with kubeapi's scheme and
// codecs. It speaks JSON: kubeapi's objects have no protobuf code (a
// protobuf answer would not decode), and JSON leaves out the fields they
// do not declare.
func restClient(rc *rest.Config, gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
	c := rest.CopyConfig(rc)
	c.GroupVersion, c.APIPath = &gv, apiPath
	c.NegotiatedSerializer = kubeapi.Codecs.WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = "eztunnel"
	}
	c.ContentType, c.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
	rcl, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %s client: %w", gv, err)
	}
	return rcl, nil
}
