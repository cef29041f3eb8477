//go:build linux

package cidroute

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// transparentOpt returns the level and option of IP_TRANSPARENT for a
// socket of the family of six.
func transparentOpt(six bool) (level, opt int, name string) {
	if six {
		return unix.SOL_IPV6, unix.IPV6_TRANSPARENT, "IPV6_TRANSPARENT"
	}
	return unix.SOL_IP, unix.IP_TRANSPARENT, "IP_TRANSPARENT"
}

// probeTransparent sets IP_TRANSPARENT (IPV6_TRANSPARENT) on a socket it
// then closes: the kernel refuses it without CAP_NET_ADMIN or
// CAP_NET_RAW.
func probeTransparent(six bool) error {
	family := unix.AF_INET
	if six {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("original source: probe socket: %w: %w", err, ErrOriginalSource)
	}
	defer unix.Close(fd)
	level, opt, name := transparentOpt(six)
	if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("original source: setsockopt %s: %w: the process needs CAP_NET_ADMIN (or CAP_NET_RAW): %w", name, err, ErrOriginalSource)
		}
		return fmt.Errorf("original source: setsockopt %s: %w: %w", name, err, ErrOriginalSource)
	}
	return nil
}

// dialOriginal opens a socket bound to client's address and port and
// connected to backend. SO_REUSEADDR lets a client with sessions on two
// backends have two sockets on its address; the kernel tells them apart
// by the peer they are connected to.
func dialOriginal(client, backend netip.AddrPort) (*net.UDPConn, error) {
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	backend = netip.AddrPortFrom(backend.Addr().Unmap(), backend.Port())
	six := backend.Addr().Is6()
	if client.Addr().Is6() != six {
		return nil, fmt.Errorf("original source: client %v and backend %v are of different families: %w", client, backend, ErrConfig)
	}
	network := "udp4"
	if six {
		network = "udp6"
	}
	level, opt, _ := transparentOpt(six)
	d := net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(client), Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), level, opt, 1); serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			}
		})
		return errors.Join(err, serr)
	}}
	c, err := d.DialContext(context.Background(), network, backend.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

// checkReturnRoute asks the kernel how it would route a datagram from
// backend b, arriving on the interface the proxy reaches b through, to a
// client address: original-source mode needs it delivered locally.
func checkReturnRoute(b netip.AddrPort) error {
	b = netip.AddrPortFrom(b.Addr().Unmap(), b.Port())
	probe := originalSourceProbe4
	if b.Addr().Is6() {
		probe = originalSourceProbe6
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("original source: backend %v: "+format+": %w", append(append([]any{b}, args...), ErrOriginalSource)...)
	}
	out, err := routeGet(routeQuery{dst: b.Addr()})
	if err != nil {
		return fail("no route to it: %w", err)
	}
	if out.typ == unix.RTN_LOCAL {
		return fail("it is on the proxy's own host; original source needs backends on other hosts")
	}
	ifname := fmt.Sprint("#", out.oif)
	if ifi, err := net.InterfaceByIndex(out.oif); err == nil {
		ifname = ifi.Name
	}
	in, err := routeGet(routeQuery{dst: probe.Addr(), src: b.Addr(), iif: out.oif, sport: b.Port(), dport: probe.Port()})
	ipcmd, all := "ip", "0.0.0.0/0"
	if b.Addr().Is6() {
		ipcmd, all = "ip -6", "::/0"
	}
	fix := fmt.Sprintf("route the datagrams arriving from the backends to a local table, e.g. `%s rule add from %v iif %s ipproto udp lookup 100` and `%s route add local %s dev lo table 100` (docs/original-source.md)",
		ipcmd, b.Addr(), ifname, ipcmd, all)
	switch {
	case err != nil:
		return fail("a reply to a client (%v) arriving on %s would not be delivered to the proxy (%v); %s", probe.Addr(), ifname, err, fix)
	case in.typ != unix.RTN_LOCAL:
		return fail("a reply to a client (%v) arriving on %s would be routed as %s, not delivered to the proxy; %s", probe.Addr(), ifname, routeTypeName(in.typ), fix)
	}
	return nil
}

func routeTypeName(t uint8) string {
	switch t {
	case unix.RTN_UNICAST:
		return "unicast (forwarded)"
	case unix.RTN_BLACKHOLE:
		return "blackhole"
	case unix.RTN_UNREACHABLE:
		return "unreachable"
	case unix.RTN_PROHIBIT:
		return "prohibit"
	}
	return fmt.Sprint("type ", t)
}

type routeQuery struct {
	dst, src     netip.Addr
	iif          int // 0: an output route lookup
	sport, dport uint16
}

type routeAnswer struct {
	typ uint8
	oif int
}

// Route attributes of Linux 4.17 that x/sys does not name.
const (
	rtaIPProto = 27
	rtaSport   = 28
	rtaDport   = 29
)

// routeGet is `ip route get`: one RTM_GETROUTE request on a netlink
// socket of its own.
func routeGet(q routeQuery) (routeAnswer, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return routeAnswer{}, err
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 2}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return routeAnswer{}, err
	}
	family, bits := byte(unix.AF_INET), byte(32)
	if q.dst.Is6() {
		family, bits = unix.AF_INET6, 128
	}
	// nlmsghdr (16), rtmsg (12), attributes.
	msg := make([]byte, 16+12, 128)
	msg[16], msg[17] = family, bits
	attr := func(typ uint16, v []byte) {
		var h [4]byte
		binary.NativeEndian.PutUint16(h[0:], uint16(4+len(v)))
		binary.NativeEndian.PutUint16(h[2:], typ)
		msg = append(msg, h[:]...)
		msg = append(msg, v...)
		for len(msg)%4 != 0 {
			msg = append(msg, 0)
		}
	}
	attr(unix.RTA_DST, q.dst.AsSlice())
	if q.src.IsValid() {
		msg[18] = bits
		attr(unix.RTA_SRC, q.src.AsSlice())
	}
	if q.iif != 0 {
		attr(unix.RTA_IIF, binary.NativeEndian.AppendUint32(nil, uint32(q.iif)))
		attr(rtaIPProto, []byte{unix.IPPROTO_UDP})
		attr(rtaSport, binary.BigEndian.AppendUint16(nil, q.sport))
		attr(rtaDport, binary.BigEndian.AppendUint16(nil, q.dport))
	}
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], unix.RTM_GETROUTE)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:], 1)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return routeAnswer{}, err
	}
	buf := make([]byte, 8192)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return routeAnswer{}, err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return routeAnswer{}, err
	}
	for i := range msgs {
		m := &msgs[i]
		switch m.Header.Type {
		case unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
					return routeAnswer{}, syscall.Errno(errno)
				}
			}
		case unix.RTM_NEWROUTE:
			if len(m.Data) < unix.SizeofRtMsg {
				continue
			}
			a := routeAnswer{typ: m.Data[7]}
			attrs, err := syscall.ParseNetlinkRouteAttr(m)
			if err != nil {
				return routeAnswer{}, err
			}
			for _, at := range attrs {
				if at.Attr.Type == unix.RTA_OIF && len(at.Value) >= 4 {
					a.oif = int(binary.NativeEndian.Uint32(at.Value))
				}
			}
			return a, nil
		}
	}
	return routeAnswer{}, errors.New("no route in the kernel's answer")
}
