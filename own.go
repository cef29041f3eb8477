package cidroute

import (
	"net"
	"net/netip"
	"slices"
)

// OwnAddrs is the set of addresses at which this process receives
// datagrams: the address of each socket it bound, and for a socket bound
// to a wildcard address (0.0.0.0 or ::), that port at every address of the
// host. Both rules refuse to send to it (the reverse rule as
// BadDestination, the forward rule as OwnAddress): a datagram the proxy
// sends to itself comes back in as a client datagram and can loop between
// two services for ever.
//
// Sockets connected to one peer (transparent mode's session sockets) are
// not in it: the kernel gives them only their peer's datagrams.
//
// An OwnAddrs is immutable and safe for concurrent use; the nil *OwnAddrs
// is the empty set. A Pipeline keeps its own up to date (see
// Pipeline.OwnAddrs); a program that routes on its own sockets builds one
// with NewOwnAddrs.
type OwnAddrs struct {
	ports [1 << 10]uint64  // bitmap of every bound port: the common "no" costs one load
	exact []netip.AddrPort // sockets bound to one address
	wild  []uint16         // ports of sockets bound to a wildcard address
	host  map[netip.Addr]struct{}
	nets  []netip.Prefix // local routes: every address in them is the host's
}

// NewOwnAddrs returns the set for sockets bound at bound. host is the
// host's addresses (LocalAddrs), which a wildcard-bound socket listens on;
// loopback and unspecified addresses always count as the host's. local
// are prefixes the kernel delivers locally as a whole (LocalNets: local
// routes such as the AnyIP pool of `ip route add local 10.77.0.0/24 dev
// lo`), whose every address counts as the host's too. Addresses are
// compared without zones and IPv4-mapped IPv6 as IPv4.
func NewOwnAddrs(bound []netip.AddrPort, host []netip.Addr, local ...netip.Prefix) *OwnAddrs {
	o := &OwnAddrs{host: make(map[netip.Addr]struct{}, len(host))}
	for _, a := range host {
		o.host[plain(a)] = struct{}{}
	}
	for _, n := range local {
		ip := plain(n.Addr())
		bits := n.Bits() - (n.Addr().BitLen() - ip.BitLen()) // ::ffff:10.0.0.0/120 is 10.0.0.0/24
		if p := netip.PrefixFrom(ip, bits); p.IsValid() {
			o.nets = append(o.nets, p.Masked())
		}
	}
	for _, b := range bound {
		p := b.Port()
		o.ports[p>>6] |= 1 << (p & 63)
		if ip := plain(b.Addr()); ip.IsUnspecified() || !ip.IsValid() {
			if !slices.Contains(o.wild, p) {
				o.wild = append(o.wild, p)
			}
		} else {
			o.exact = append(o.exact, netip.AddrPortFrom(ip, p))
		}
	}
	return o
}

// Contains reports whether a datagram sent to a reaches this process.
// It inlines to two loads for a port the process has not bound, the
// common case on both paths.
func (o *OwnAddrs) Contains(a netip.AddrPort) bool {
	return o != nil && o.hasPort(a.Port()) && o.contains(a)
}

func (o *OwnAddrs) hasPort(p uint16) bool { return o.ports[p>>6]>>(p&63)&1 != 0 }

func (o *OwnAddrs) contains(a netip.AddrPort) bool {
	p := a.Port()
	ip := plain(a.Addr())
	if slices.Contains(o.exact, netip.AddrPortFrom(ip, p)) {
		return true
	}
	return slices.Contains(o.wild, p) && o.IsHost(ip)
}

// IsHost reports whether ip is an address of the host: loopback,
// unspecified (which the kernel delivers locally), one of the addresses
// the set was built with or inside one of its local prefixes.
func (o *OwnAddrs) IsHost(ip netip.Addr) bool {
	ip = plain(ip)
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	if o == nil {
		return false
	}
	if _, ok := o.host[ip]; ok {
		return true
	}
	for _, n := range o.nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// plain drops a zone and unmaps an IPv4-mapped address.
func plain(ip netip.Addr) netip.Addr { return ip.Unmap().WithZone("") }

// LocalAddrs returns the addresses of the host's interfaces, and for each
// IPv4 subnet wider than /31 its directed broadcast address, which the
// host receives too.
func LocalAddrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ifa := range ifas {
		n, ok := ifa.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		out = append(out, ip)
		if ones, bits := n.Mask.Size(); ip.Is4() && bits == 32 && ones < 31 {
			b := ip.As4()
			for i := range b {
				b[i] |= ^n.Mask[len(n.Mask)-4+i]
			}
			out = append(out, netip.AddrFrom4(b))
		}
	}
	return out, nil
}
