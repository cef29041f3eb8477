// Command cidproxy, the Kubernetes build: the same program as
// examples/cidproxy, plus services whose backends are the endpoints of a
// Kubernetes Service ("kubernetes": {"namespace", "service", "port_name",
// "kubeconfig", "watch_pods", "weight_annotation", "pod_selector"} in the
// JSON config). It is its own module so that client-go
// stays out of the main module.
package main

import (
	"log/slog"

	"github.com/cidroute/cidroute/examples/internal/proxyapp"
	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/registry/kubernetes"
)

func main() { proxyapp.Main(proxyapp.Options{Kubernetes: endpointSlices}) }

// endpointSlices makes the EndpointSlice source of one service, with the
// in-cluster configuration or the named kubeconfig.
func endpointSlices(k proxyconfig.Kubernetes, log *slog.Logger) (registry.Source, error) {
	client, err := kubernetes.NewClient(k.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.New(kubernetes.Config{Client: client, Namespace: k.Namespace, Service: k.Service, PortName: k.PortName, Logger: log,
		WatchPods: k.WatchPods, WeightAnnotation: k.WeightAnnotation, PodSelector: k.PodSelector})
}
