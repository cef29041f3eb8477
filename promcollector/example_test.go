package promcollector_test

import (
	"log"
	"net/http"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/promcollector"
	"github.com/cidroute/cidroute/registry"
)

// A proxy embedded in a program, serving cidproxy's metrics on its own
// /metrics.
func Example() {
	reg, err := registry.NewStatic(registry.Config{Service: "coaps", Seed: 42}, []registry.Backend{
		{Ordinal: 0, Addr: netip.MustParseAddrPort("10.0.0.10:5684")},
	})
	if err != nil {
		log.Fatal(err)
	}
	pipe, err := cidroute.New(cidroute.Config{Services: []cidroute.Service{{
		Name: "coaps", Listen: netip.MustParseAddrPort("127.0.0.1:0"),
		RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, Backends: reg},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	defer pipe.Close()
	c, err := promcollector.New(promcollector.Config{Pipeline: pipe,
		Registry: func(string) (*registry.Registry, bool) { return reg, true }})
	if err != nil {
		log.Fatal(err)
	}
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(c)
	http.Handle("/metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	// go pipe.Run(ctx); http.ListenAndServe(":9184", nil)
}
