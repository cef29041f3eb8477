package kubernetes

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/cidroute/cidroute/registry"
)

// Reasons an endpoint or a slice is left out, for the log.
var (
	errNoOrdinal    = errors.New("no ordinal: neither the hostname nor the pod name ends in -N (0-254)")
	errNoAddress    = errors.New("no usable address")
	errNoPort       = errors.New("no usable port")
	errPortProtocol = errors.New("port is not UDP")
)

// skip records an endpoint (or a whole slice) left out of the backend list,
// and why. Comparable, so that a set of them can be diffed between rebuilds.
type skip struct {
	slice    string // slice name
	endpoint string // pod or address; "" for the whole slice
	reason   string
}

// mapper turns a service's EndpointSlices into a backend list. It holds no
// state: the same slices give the same list on every replica.
type mapper struct {
	service     string
	portName    string
	addressType discoveryv1.AddressType // "" = IPv4 if any IPv4 slice exists, else IPv6

	// pod, when set (Config.WatchPods), returns an endpoint's Pod from the
	// informer's cache, nil when the cache has none; weightKey is the
	// annotation that holds its weight.
	pod       func(name string) *corev1.Pod
	weightKey string
}

// MaxWeight is the largest weight a Pod's weight annotation may give: a
// ratio of more than 10000 to 1 between the pods of one Service is a
// mistake (a unit, a misplaced digit), not a capacity.
const MaxWeight = 10000

// pendingReady is the ReadySince of a ready endpoint whose Pod the cache
// does not show ready yet (its watch lags the EndpointSlices'): a time in
// the future, which the registry counts as the first step of a slow start
// until the Pod's own time arrives. It is never later than that time's
// step, so the backend's share only grows.
var pendingReady = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// podBackend returns the weight (0: the default, 1) and ReadySince that
// an endpoint's Pod gives its backend; bad is the reason its weight
// annotation was refused ("" if not), in which case the weight is 0.
func (m mapper) podBackend(ep discoveryv1.Endpoint, st registry.State) (weight uint32, since time.Time, bad string) {
	if m.pod == nil || ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" {
		return weight, since, ""
	}
	p := m.pod(ep.TargetRef.Name)
	if st == registry.Ready {
		since = pendingReady
		if p != nil {
			if t, ok := podReadySince(p); ok {
				since = t
			}
		}
	}
	if p == nil {
		return weight, since, ""
	}
	v, ok := p.Annotations[m.weightKey]
	if !ok {
		return weight, since, ""
	}
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
	if err != nil || n < 1 || n > MaxWeight {
		return 0, since, fmt.Sprintf("%s %q is not a weight: want an integer 1-%d; using 1", m.weightKey, v, MaxWeight)
	}
	return uint32(n), since, ""
}

// podReadySince returns when the Pod became ready: its Ready condition's
// lastTransitionTime, the same for every watcher. ok is false while the
// Pod is not ready or the time is unset.
func podReadySince(p *corev1.Pod) (time.Time, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			if c.Status != corev1.ConditionTrue || c.LastTransitionTime.IsZero() {
				return time.Time{}, false
			}
			return c.LastTransitionTime.UTC(), true
		}
	}
	return time.Time{}, false
}

// entry is a backend candidate with where it came from, for merging.
type entry struct {
	b    registry.Backend
	from string // slice/endpoint, for logs
}

// backends maps slices to backends. The result is sorted by ordinal, then
// address, and does not depend on the order of slices, so replicas that see
// the same slices agree byte for byte.
//
// An endpoint listed twice (in two slices while it moves between them) with
// the same ordinal and address becomes one backend in its most serving
// state. Two endpoints with the same ordinal and different addresses are both
// kept, so that the registry rejects the list: a misconfiguration is not
// papered over. A gone endpoint whose address a serving one of another
// ordinal now holds is dropped: the address belongs to the new pod.
//
// With Pods (m.pod), each backend's weight and ReadySince come from its
// Pod; a weight annotation that is refused is reported in bad, and the
// backend keeps weight 1.
func (m mapper) backends(in []*discoveryv1.EndpointSlice) (bs []registry.Backend, skips, bad []skip) {
	sl := make([]*discoveryv1.EndpointSlice, 0, len(in))
	for _, s := range in {
		if s.Labels[discoveryv1.LabelServiceName] == m.service {
			sl = append(sl, s)
		}
	}
	slices.SortFunc(sl, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })

	at := m.addressType
	if at == "" {
		at = discoveryv1.AddressTypeIPv6
		for _, s := range sl {
			if s.AddressType == discoveryv1.AddressTypeIPv4 {
				at = discoveryv1.AddressTypeIPv4
				break
			}
		}
	}

	type key struct {
		ord  uint8
		addr netip.AddrPort
	}
	merged := make(map[key]registry.Backend)
	for _, s := range sl {
		// Dual-stack services have one slice family per address type; the
		// other family would repeat every ordinal.
		if s.AddressType != at || len(s.Endpoints) == 0 {
			continue
		}
		port, err := m.port(s)
		if err != nil {
			skips = append(skips, skip{slice: s.Name, reason: err.Error()})
			continue
		}
		for _, ep := range s.Endpoints {
			ord, addr, err := endpointBackend(ep, port)
			if err != nil {
				skips = append(skips, skip{slice: s.Name, endpoint: endpointName(ep), reason: err.Error()})
				continue
			}
			k := key{ord, addr}
			st := endpointState(ep.Conditions)
			if old, ok := merged[k]; !ok || st < old.State { // Ready < Draining < Gone
				w, since, why := m.podBackend(ep, st)
				if why != "" {
					bad = append(bad, skip{slice: s.Name, endpoint: endpointName(ep), reason: why})
				}
				merged[k] = registry.Backend{Ordinal: ord, Addr: addr, State: st, Weight: w, ReadySince: since}
			}
		}
	}

	bs = make([]registry.Backend, 0, len(merged))
	for _, b := range merged {
		bs = append(bs, b)
	}
	slices.SortFunc(bs, func(a, b registry.Backend) int {
		return cmp.Or(cmp.Compare(a.Ordinal, b.Ordinal), a.Addr.Compare(b.Addr))
	})

	serving := make(map[netip.AddrPort]bool, len(bs))
	for _, b := range bs {
		if b.State.Serving() {
			serving[b.Addr] = true
		}
	}
	bs = slices.DeleteFunc(bs, func(b registry.Backend) bool { return b.State == registry.Gone && serving[b.Addr] })
	return bs, skips, bad
}

// port returns the slice's port for the configured name: the named port,
// or the only port when no name is configured.
func (m mapper) port(s *discoveryv1.EndpointSlice) (uint16, error) {
	var p *discoveryv1.EndpointPort
	switch {
	case m.portName != "":
		for i := range s.Ports {
			if s.Ports[i].Name != nil && *s.Ports[i].Name == m.portName {
				p = &s.Ports[i]
				break
			}
		}
		if p == nil {
			return 0, fmt.Errorf("%w: slice has no port named %q", errNoPort, m.portName)
		}
	case len(s.Ports) == 1:
		p = &s.Ports[0]
	default:
		return 0, fmt.Errorf("%w: slice has %d ports; configure a port name", errNoPort, len(s.Ports))
	}
	if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
		return 0, fmt.Errorf("%w: port number missing or out of range", errNoPort)
	}
	// The API's default protocol is TCP.
	if p.Protocol == nil || *p.Protocol != corev1.ProtocolUDP {
		return 0, errPortProtocol
	}
	return uint16(*p.Port), nil
}

// endpointBackend returns an endpoint's ordinal and address.
func endpointBackend(ep discoveryv1.Endpoint, port uint16) (uint8, netip.AddrPort, error) {
	ord, ok := uint8(0), false
	if ep.Hostname != nil {
		ord, ok = registry.OrdinalFromHostname(*ep.Hostname)
	}
	if !ok && ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
		ord, ok = registry.OrdinalFromHostname(ep.TargetRef.Name)
	}
	if !ok {
		return 0, netip.AddrPort{}, errNoOrdinal
	}
	// The API says the addresses of one endpoint are fungible and that
	// consumers may use the first.
	if len(ep.Addresses) == 0 {
		return 0, netip.AddrPort{}, errNoAddress
	}
	a, err := netip.ParseAddr(ep.Addresses[0])
	if err != nil || a.Zone() != "" {
		return 0, netip.AddrPort{}, fmt.Errorf("%w: %q", errNoAddress, ep.Addresses[0])
	}
	return ord, netip.AddrPortFrom(a.Unmap(), port), nil
}

// endpointState maps EndpointSlice conditions to a backend state. A nil
// ready or serving means true and a nil terminating means false, as the API
// documents. Ready also needs serving and not terminating, because a Service
// with publishNotReadyAddresses (common for StatefulSets' headless
// Services) marks every endpoint ready, even unready and terminating pods;
// serving is the pod's real readiness.
func endpointState(c discoveryv1.EndpointConditions) registry.State {
	ready := c.Ready == nil || *c.Ready
	serving := c.Serving == nil || *c.Serving
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case serving && terminating:
		return registry.Draining
	case ready && serving:
		return registry.Ready
	default:
		return registry.Gone
	}
}

// endpointName names an endpoint in logs: its pod, else its first address.
func endpointName(ep discoveryv1.Endpoint) string {
	switch {
	case ep.TargetRef != nil && ep.TargetRef.Name != "":
		return ep.TargetRef.Name
	case ep.Hostname != nil:
		return *ep.Hostname
	case len(ep.Addresses) > 0:
		return ep.Addresses[0]
	}
	return "?"
}
