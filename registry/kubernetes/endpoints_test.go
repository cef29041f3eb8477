package kubernetes

import (
	"net/netip"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cidroute/cidroute/registry"
)

// Builders for EndpointSlices as the EndpointSlice controller writes them.

type cond uint8

const (
	ready       cond = iota // ready, serving, not terminating
	unready                 // not ready, not serving, not terminating
	terminating             // serving and terminating
	terminated              // not serving, terminating
)

func (c cond) conditions() discoveryv1.EndpointConditions {
	t, f := true, false
	switch c {
	case ready:
		return discoveryv1.EndpointConditions{Ready: &t, Serving: &t, Terminating: &f}
	case unready:
		return discoveryv1.EndpointConditions{Ready: &f, Serving: &f, Terminating: &f}
	case terminating:
		return discoveryv1.EndpointConditions{Ready: &f, Serving: &t, Terminating: &t}
	default:
		return discoveryv1.EndpointConditions{Ready: &f, Serving: &f, Terminating: &t}
	}
}

// pod is an endpoint of a StatefulSet pod: hostname and targetRef set.
func pod(name, addr string, c cond) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Hostname:   &name,
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: name},
		Conditions: c.conditions(),
	}
}

func udpPort(name string, port int32) discoveryv1.EndpointPort {
	udp := corev1.ProtocolUDP
	return discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &udp}
}

// slice returns an IPv4 slice of service "svc" with the UDP port dtls=5684.
func slice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: "ns",
			Labels:    map[string]string{discoveryv1.LabelServiceName: "svc"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{udpPort("dtls", 5684)},
	}
}

func be(ord uint8, addr string, st registry.State) registry.Backend {
	return registry.Backend{Ordinal: ord, Addr: netip.MustParseAddrPort(addr), State: st}
}

func TestEndpointState(t *testing.T) {
	tr, f := true, false
	for _, tc := range []struct {
		name string
		c    discoveryv1.EndpointConditions
		want registry.State
	}{
		{"ready", ready.conditions(), registry.Ready},
		{"unready", unready.conditions(), registry.Gone},
		{"terminating and serving", terminating.conditions(), registry.Draining},
		{"terminated", terminated.conditions(), registry.Gone},
		{"all nil means ready", discoveryv1.EndpointConditions{}, registry.Ready},
		{"ready nil, serving false", discoveryv1.EndpointConditions{Serving: &f}, registry.Gone},
		{"not ready, serving nil", discoveryv1.EndpointConditions{Ready: &f}, registry.Gone},
		// publishNotReadyAddresses: ready is forced true; serving is the truth.
		{"published unready pod", discoveryv1.EndpointConditions{Ready: &tr, Serving: &f, Terminating: &f}, registry.Gone},
		{"published terminating pod", discoveryv1.EndpointConditions{Ready: &tr, Serving: &tr, Terminating: &tr}, registry.Draining},
		{"published terminated pod", discoveryv1.EndpointConditions{Ready: &tr, Serving: &f, Terminating: &tr}, registry.Gone},
	} {
		require.Equal(t, tc.want, endpointState(tc.c), tc.name)
	}
}

func TestBackends(t *testing.T) {
	m := mapper{service: "svc", portName: "dtls"}
	other := slice("other-abc", pod("x-9", "10.0.9.9", ready))
	other.Labels[discoveryv1.LabelServiceName] = "other"
	v6 := slice("svc-v6", pod("ds-0", "fd00::10", ready), pod("ds-1", "fd00::11", ready))
	v6.AddressType = discoveryv1.AddressTypeIPv6

	for _, tc := range []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		want   []registry.Backend
		skips  int
	}{
		{
			name:   "states",
			slices: []*discoveryv1.EndpointSlice{slice("svc-a", pod("ds-2", "10.0.0.2", terminating), pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.3", unready))},
			want:   []registry.Backend{be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.3:5684", registry.Gone), be(2, "10.0.0.2:5684", registry.Draining)},
		},
		{
			name: "split across slices, other services ignored",
			slices: []*discoveryv1.EndpointSlice{
				slice("svc-b", pod("ds-1", "10.0.0.2", ready)), other,
				slice("svc-a", pod("ds-0", "10.0.0.1", ready)),
			},
			want: []registry.Backend{be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Ready)},
		},
		{
			name: "endpoint in two slices during a move: most serving state wins",
			slices: []*discoveryv1.EndpointSlice{
				slice("svc-a", pod("ds-0", "10.0.0.1", terminating), pod("ds-1", "10.0.0.2", unready)),
				slice("svc-b", pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.2", terminating)),
			},
			want: []registry.Backend{be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Draining)},
		},
		{
			name: "duplicate ordinal kept for the registry to reject",
			slices: []*discoveryv1.EndpointSlice{
				slice("svc-a", pod("ds-2", "10.0.0.2", ready)),
				slice("svc-b", pod("other-2", "10.0.0.3", ready)),
			},
			want: []registry.Backend{be(2, "10.0.0.2:5684", registry.Ready), be(2, "10.0.0.3:5684", registry.Ready)},
		},
		{
			name:   "gone endpoint whose address a new pod holds is dropped",
			slices: []*discoveryv1.EndpointSlice{slice("svc-a", pod("ds-1", "10.0.0.5", terminated), pod("ds-3", "10.0.0.5", ready))},
			want:   []registry.Backend{be(3, "10.0.0.5:5684", registry.Ready)},
		},
		{
			name: "no parsable ordinal: skipped",
			slices: []*discoveryv1.EndpointSlice{slice("svc-a",
				pod("ds-0", "10.0.0.1", ready), pod("web", "10.0.0.2", ready), pod("ds-255", "10.0.0.3", ready),
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.4"}})},
			want:  []registry.Backend{be(0, "10.0.0.1:5684", registry.Ready)},
			skips: 3,
		},
		{
			name: "hostname without ordinal falls back to the pod name",
			slices: []*discoveryv1.EndpointSlice{slice("svc-a", func() discoveryv1.Endpoint {
				ep := pod("ds-4", "10.0.0.4", ready)
				h := "custom"
				ep.Hostname = &h
				return ep
			}())},
			want: []registry.Backend{be(4, "10.0.0.4:5684", registry.Ready)},
		},
		{
			name: "bad addresses: skipped",
			slices: []*discoveryv1.EndpointSlice{slice("svc-a",
				pod("ds-0", "not-an-ip", ready), pod("ds-1", "fe80::1%eth0", ready),
				discoveryv1.Endpoint{Hostname: ptr("ds-2")})},
			skips: 3,
		},
		{
			name:   "dual stack: IPv4 family by default",
			slices: []*discoveryv1.EndpointSlice{v6, slice("svc-v4", pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.2", ready))},
			want:   []registry.Backend{be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Ready)},
		},
		{
			name:   "IPv6 only",
			slices: []*discoveryv1.EndpointSlice{v6},
			want:   []registry.Backend{be(0, "[fd00::10]:5684", registry.Ready), be(1, "[fd00::11]:5684", registry.Ready)},
		},
		{
			name:   "empty placeholder slice",
			slices: []*discoveryv1.EndpointSlice{{ObjectMeta: metav1.ObjectMeta{Name: "svc-x", Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}}, AddressType: discoveryv1.AddressTypeIPv4}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, skips, _ := m.backends(tc.slices)
			require.Equal(t, tc.want, nilIfEmpty(got))
			require.Len(t, skips, tc.skips, "%v", skips)
			// Slice order does not matter.
			rev := slices.Clone(tc.slices)
			slices.Reverse(rev)
			got2, _, _ := m.backends(rev)
			require.Equal(t, got, got2)
		})
	}
}

func TestBackendsPorts(t *testing.T) {
	eps := []discoveryv1.Endpoint{pod("ds-0", "10.0.0.1", ready)}
	tcp := corev1.ProtocolTCP
	two := slice("svc-a", eps...)
	two.Ports = []discoveryv1.EndpointPort{udpPort("metrics", 9090), udpPort("dtls", 5684)}
	tcpOnly := slice("svc-a", eps...)
	tcpOnly.Ports[0].Protocol = &tcp
	noProto := slice("svc-a", eps...)
	noProto.Ports[0].Protocol = nil
	noNum := slice("svc-a", eps...)
	noNum.Ports[0].Port = nil

	for _, tc := range []struct {
		name     string
		portName string
		s        *discoveryv1.EndpointSlice
		want     uint16 // 0: the slice is skipped
	}{
		{"named", "dtls", two, 5684},
		{"named, missing", "quic", two, 0},
		{"unnamed, one port", "", slice("svc-a", eps...), 5684},
		{"unnamed, two ports", "", two, 0},
		{"tcp", "dtls", tcpOnly, 0},
		{"protocol unset means tcp", "dtls", noProto, 0},
		{"no port number", "dtls", noNum, 0},
	} {
		m := mapper{service: "svc", portName: tc.portName}
		got, skips, _ := m.backends([]*discoveryv1.EndpointSlice{tc.s})
		if tc.want == 0 {
			require.Empty(t, got, tc.name)
			require.Len(t, skips, 1, tc.name)
			require.Empty(t, skips[0].endpoint, tc.name)
			continue
		}
		require.Equal(t, []registry.Backend{be(0, "10.0.0.1:"+strconv.Itoa(int(tc.want)), registry.Ready)}, got, tc.name)
	}
}

func ptr[T any](v T) *T { return &v }

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}
