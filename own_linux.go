//go:build linux

package cidroute

import (
	"errors"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// LocalNets returns the prefixes of the kernel's local routes (type
// RTN_LOCAL, in any routing table) that cover more than one address and
// are not loopback: the AnyIP pattern of VIP pools, `ip route add local
// 10.77.0.0/24 dev lo`, makes the host receive every address of the
// prefix although no interface holds them. Single addresses are the
// interfaces' own, which LocalAddrs returns.
func LocalNets() ([]netip.Prefix, error) {
	b, err := syscall.NetlinkRIB(syscall.RTM_GETROUTE, syscall.AF_UNSPEC)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for i := range msgs {
		if n, ok := localRoute(&msgs[i]); ok && n.Bits() < n.Addr().BitLen() && !n.Addr().IsLoopback() {
			out = append(out, n)
		}
	}
	return out, nil
}

// localRoute returns the destination of a route message of type
// RTN_LOCAL.
func localRoute(m *syscall.NetlinkMessage) (netip.Prefix, bool) {
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type.
	if m.Header.Type != syscall.RTM_NEWROUTE && m.Header.Type != syscall.RTM_DELROUTE ||
		len(m.Data) < syscall.SizeofRtMsg || m.Data[7] != syscall.RTN_LOCAL {
		return netip.Prefix{}, false
	}
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return netip.Prefix{}, false
	}
	for _, a := range attrs {
		if a.Attr.Type == syscall.RTA_DST {
			ip, ok := netip.AddrFromSlice(a.Value)
			if !ok {
				return netip.Prefix{}, false
			}
			n := netip.PrefixFrom(ip, int(m.Data[1]))
			return n.Masked(), n.IsValid()
		}
	}
	return netip.Prefix{}, false
}

// hostChange reports whether a notification read from the rtnetlink
// socket can change the host's addresses: an address message, or a
// route message for a local route. Other route changes (a router's
// table can change thousands of times a second) cost no rescan.
func hostChange(b []byte) bool {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return true
	}
	for i := range msgs {
		switch msgs[i].Header.Type {
		case syscall.RTM_NEWADDR, syscall.RTM_DELADDR:
			return true
		}
		if _, ok := localRoute(&msgs[i]); ok {
			return true
		}
	}
	return false
}

// watchHostAddrs calls changed after each change of the host's addresses
// until stop is closed. It listens to the kernel's address notifications
// (rtnetlink RTM_NEWADDR / RTM_DELADDR, and route messages for local
// routes): an address the proxy gains is in its own-address set as soon
// as the notification is read, where a periodic interface scan would
// leave a window of a whole period in which a reply to it could start a
// loop. The messages only trigger a rescan (LocalAddrs, LocalNets), and
// an overflow (ENOBUFS) is handled like a change. When the socket cannot be opened it falls
// back to scanning every hostScanInterval.
func watchHostAddrs(stop <-chan struct{}, changed func()) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR | unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE})
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		scanHostAddrs(stop, changed)
		return
	}
	// A non-blocking descriptor in an *os.File waits on the netpoller, so
	// closing it wakes the read.
	f := os.NewFile(uintptr(fd), "rtnetlink")
	done := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-done:
		}
		f.Close()
	}()
	defer close(done)
	// An address that came or went between the caller's last scan (New)
	// and the bind above notified nobody: scan once now that nothing is
	// missed.
	changed()
	buf := make([]byte, 1<<16)
	for {
		n, err := f.Read(buf)
		select {
		case <-stop:
			return
		default:
		}
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			scanHostAddrs(stop, changed) // the socket failed: poll instead
			return
		}
		if err != nil || hostChange(buf[:n]) {
			changed()
		}
	}
}
