package promcollector_test

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/promcollector"
	"github.com/cidroute/cidroute/registry"
)

// TestCollect: every reason each direction can count is listed at 0 from
// the first scrape, a counted drop shows under its reason, received is
// forwarded plus the drops, and a further path gets its own label.
func TestCollect(t *testing.T) {
	proxy := cidroutetest.Start(t, 1, cidroute.Service{Name: "coaps", RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}},
		registry.Backend{Ordinal: 0, Addr: netip.MustParseAddrPort("127.0.0.1:9")})
	xdp := []cidroute.ServiceStats{{Name: "coaps"}}
	xdp[0].Forward.Received, xdp[0].Forward.Forwarded = 5, 5
	c, err := promcollector.New(promcollector.Config{Pipeline: proxy.Pipeline,
		Registry: func(string) (*registry.Registry, bool) { return proxy.Registry, true },
		Paths:    []promcollector.Path{{Name: "xdp", Stats: func() []cidroute.ServiceStats { return xdp }}}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	client.WriteToUDPAddrPort([]byte("not DTLS"), proxy.Addr)
	deadline := time.Now().Add(5 * time.Second)
	for proxy.Stats()[0].Forward.Received == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the datagram never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}

	n, err := testutil.GatherAndCount(reg, "cidroute_datagrams_total")
	if err != nil {
		t.Fatal(err)
	}
	want := 2 // forwarded, in each direction
	for range (cidroute.ForwardDrops).All() {
		want++
	}
	for range (cidroute.ReverseDrops).All() {
		want++
	}
	if n != 2*want {
		t.Errorf("%d cidroute_datagrams_total series, want %d per path", n, want)
	}
	for _, tc := range []struct{ name, labels string }{
		{"malformed, counted", `cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="malformed",service="coaps"} 1`},
		{"cid_length, listed at 0", `cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="cid_length",service="coaps"} 0`},
		{"reverse reason", `cidroute_datagrams_total{direction="reverse",outcome="dropped",path="socket",reason="untrusted_sender",service="coaps"} 0`},
		{"received", `cidroute_datagrams_received_total{direction="forward",path="socket",service="coaps"} 1`},
		{"xdp path", `cidroute_datagrams_total{direction="forward",outcome="forwarded",path="xdp",reason="",service="coaps"} 5`},
		{"registry", `cidroute_registry_backends{service="coaps",state="ready"} 1`},
		{"version", `cidroute_registry_snapshot_version{service="coaps"} 1`},
		{"kernel drops", `cidroute_kernel_drops_total{direction="forward",service="coaps"} 0`},
		{"kernel drops, reverse", `cidroute_kernel_drops_total{direction="reverse",service="coaps"} 0`},
		{"one batch", `cidroute_batch_size_count{direction="forward",service="coaps"} 1`},
		{"of one datagram", `cidroute_batch_size_sum{direction="forward",service="coaps"} 1`},
		{"in the first bucket", `cidroute_batch_size_bucket{direction="forward",le="1",service="coaps"} 1`},
		{"no replies", `cidroute_batch_size_count{direction="reverse",service="coaps"} 0`},
	} {
		if !strings.Contains(gather(t, reg), tc.labels) {
			t.Errorf("%s: no %s", tc.name, tc.labels)
		}
	}
	if runtime.GOOS == "linux" { // SO_MEMINFO
		got := gather(t, reg)
		if !strings.Contains(got, `cidroute_socket_queue_bytes{direction="forward",service="coaps"} 0`) {
			t.Errorf("no empty forward queue in\n%s", got)
		}
		if !regexp.MustCompile(`cidroute_socket_queue_limit_bytes\{direction="reverse",service="coaps"\} [1-9]`).MatchString(got) {
			t.Errorf("no reverse queue limit in\n%s", got)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}

func gather(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if h := m.GetHistogram(); h != nil {
				l := strings.Join(labels, ",")
				fmt.Fprintf(&b, "%s_count{%s} %d\n%s_sum{%s} %g\n", mf.GetName(), l, h.GetSampleCount(), mf.GetName(), l, h.GetSampleSum())
				for _, bk := range h.GetBucket() {
					fmt.Fprintf(&b, "%s_bucket{%s} %d\n", mf.GetName(), strings.Join(append(labels[:1:1], append([]string{fmt.Sprintf("le=%q", fmt.Sprint(bk.GetUpperBound()))}, labels[1:]...)...), ","), bk.GetCumulativeCount())
				}
				continue
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			fmt.Fprintf(&b, "%s{%s} %g\n", mf.GetName(), strings.Join(labels, ","), v)
		}
	}
	return b.String()
}

func TestNewConfig(t *testing.T) {
	if _, err := promcollector.New(promcollector.Config{}); err == nil {
		t.Error("no pipeline accepted")
	}
	p := cidroutetest.Start(t, 1, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}},
		registry.Backend{Ordinal: 0, Addr: netip.MustParseAddrPort("127.0.0.1:9")})
	for _, path := range []promcollector.Path{{Name: "socket", Stats: func() []cidroute.ServiceStats { return nil }}, {Name: "xdp"}, {}} {
		if _, err := promcollector.New(promcollector.Config{Pipeline: p.Pipeline, Paths: []promcollector.Path{path}}); err == nil {
			t.Errorf("path %+v accepted", path)
		}
	}
}
