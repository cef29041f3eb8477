package kubernetes_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/registry/kubernetes"
)

// A Source feeding a service's registry. In a cluster the client comes from
// kubernetes.NewClient(""); here a fake API server holds one EndpointSlice
// as the EndpointSlice controller writes it for a StatefulSet "ds".
func ExampleSource() {
	yes := true
	port, name, udp := int32(5684), "dtls", corev1.ProtocolUDP
	endpoint := func(pod, addr string, ready, terminating bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses:  []string{addr},
			Hostname:   &pod,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &yes, Terminating: &terminating},
		}
	}
	client := fake.NewClientset(&discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: "dtls-backend-x7k2p", Namespace: "cidroute",
			Labels: map[string]string{discoveryv1.LabelServiceName: "dtls-backend"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &udp}},
		Endpoints: []discoveryv1.Endpoint{
			endpoint("ds-0", "10.8.0.12", true, false),
			endpoint("ds-1", "10.8.1.7", true, false),
			endpoint("ds-2", "10.8.2.3", false, true), // being deleted, still serving
		},
	})

	reg, err := registry.New(registry.Config{Service: "dtls", Seed: 7340495619, MaxAge: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	src, err := kubernetes.New(kubernetes.Config{
		Client:    client,
		Namespace: "cidroute",
		Service:   "dtls-backend",
		PortName:  "dtls",
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Run(ctx, reg) }()

	for reg.Snapshot().Version() == 0 { // the first list
		time.Sleep(time.Millisecond)
	}
	for _, b := range reg.Snapshot().Backends() {
		fmt.Println(b.Ordinal, b.Addr, b.State)
	}
	cancel()
	fmt.Println(<-done)
	// Output:
	// 0 10.8.0.12:5684 ready
	// 1 10.8.1.7:5684 ready
	// 2 10.8.2.3:5684 draining
	// <nil>
}
