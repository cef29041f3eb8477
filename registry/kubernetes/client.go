package kubernetes

import (
	"fmt"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NewClient returns a client for the API server: from the pod's service
// account when kubeconfig is "" (running in the cluster), else from the
// kubeconfig file at that path (its current context). It does not contact
// the server.
func NewClient(kubeconfig string) (k8s.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client config: %w", err)
	}
	cfg = rest.AddUserAgent(cfg, "cidroute")
	c, err := k8s.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client: %w", err)
	}
	return c, nil
}
