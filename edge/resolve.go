package edge

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"time"
)

// A ProbeFunc performs one full handshake of the service's protocol with
// the service's credentials through the edge at addr, closes it cleanly,
// and reports what it measured. It must return when ctx ends. It is called
// concurrently, once per candidate.
type ProbeFunc func(ctx context.Context, addr netip.AddrPort) (Sample, error)

// A ResolveFunc returns the service's edge addresses in the resolver's
// order. A Chooser calls it at every dial and in every watch round.
type ResolveFunc func(ctx context.Context) ([]netip.AddrPort, error)

// LookupHost resolves host through the system resolver (net.DefaultResolver,
// which is what the rest of the process uses: /etc/hosts, resolv.conf,
// nsswitch, or getaddrinfo with the cgo resolver) on every call, and pairs
// each address with port. A direct DNS query could answer differently from
// what the traffic uses, or not at all where the resolver is local.
func LookupHost(host string, port uint16) ResolveFunc {
	return func(ctx context.Context) ([]netip.AddrPort, error) {
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, err
		}
		out := make([]netip.AddrPort, 0, len(ips))
		for _, ip := range ips {
			a := netip.AddrPortFrom(ip.Unmap(), port)
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
		return out, nil
	}
}

// Static always returns addrs, in this order.
func Static(addrs ...netip.AddrPort) ResolveFunc {
	return func(context.Context) ([]netip.AddrPort, error) {
		return append([]netip.AddrPort(nil), addrs...), nil
	}
}

// A Clock tells the time and waits. The zero Config uses the system clock.
type Clock interface {
	Now() time.Time                         // as time.Now
	After(d time.Duration) <-chan time.Time // as time.After
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
