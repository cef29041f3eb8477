//go:build linux

package udpio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// ListenGroup opens n UDP sockets bound to the same address with
// SO_REUSEPORT, so the kernel spreads datagrams over them (by 4-tuple hash,
// or by AttachSteering's program); serve each with its own goroutine and
// Conn. network is "udp", "udp4" or "udp6", as for net.ListenPacket. group[i]
// is socket i of the kernel's reuseport group, the index AttachSteering
// returns; closing one socket reorders the group, so close them together.
//
// With n == 1 the socket is a plain one, without SO_REUSEPORT. With port 0
// the first socket is bound without SO_REUSEPORT, so that the kernel picks a
// port no other reuseport group of this user holds (an ephemeral bind with
// SO_REUSEPORT may join one), and the others join it.
func ListenGroup(network, addr string, n int, cfg ListenConfig) ([]*net.UDPConn, error) {
	if n < 1 {
		return nil, fmt.Errorf("group of %d sockets: %w", n, ErrConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("udpio: %w", err)
	}
	group := make([]*net.UDPConn, 0, n)
	fail := func(err error) ([]*net.UDPConn, error) {
		for _, c := range group {
			c.Close()
		}
		return nil, err
	}
	for i := range n {
		reuse := n > 1
		lateReuse := reuse && i == 0 && (portStr == "0" || portStr == "")
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			return control(rc, cfg, reuse && !lateReuse)
		}}
		pc, err := lc.ListenPacket(context.Background(), network, addr)
		if err != nil {
			return fail(fmt.Errorf("udpio: listening on %s (socket %d of %d): %w", addr, i, n, err))
		}
		c := pc.(*net.UDPConn)
		group = append(group, c)
		if lateReuse {
			if err := setReusePort(c); err != nil {
				return fail(err)
			}
			port := c.LocalAddr().(*net.UDPAddr).Port
			addr = net.JoinHostPort(host, fmt.Sprint(port))
		}
	}
	return group, nil
}

func setReusePort(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("udpio: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return fmt.Errorf("udpio: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("udpio: SO_REUSEPORT: %w", serr)
	}
	return nil
}

// control applies cfg to a socket before bind.
func control(rc syscall.RawConn, cfg ListenConfig, reuse bool) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		s := int(fd)
		set := func(what string, level, opt, v int) {
			if serr == nil {
				if err := unix.SetsockoptInt(s, level, opt, v); err != nil {
					serr = fmt.Errorf("udpio: %s: %w", what, err)
				}
			}
		}
		if reuse {
			set("SO_REUSEPORT", unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}
		// The FORCE variants need CAP_NET_ADMIN; without it the plain option
		// applies, capped by net.core.[rw]mem_max.
		if cfg.RecvBuffer > 0 && unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, cfg.RecvBuffer) != nil {
			set("SO_RCVBUF", unix.SOL_SOCKET, unix.SO_RCVBUF, cfg.RecvBuffer)
		}
		if cfg.SendBuffer > 0 && unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, cfg.SendBuffer) != nil {
			set("SO_SNDBUF", unix.SOL_SOCKET, unix.SO_SNDBUF, cfg.SendBuffer)
		}
		if cfg.PacketInfo {
			domain, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_DOMAIN)
			if err != nil {
				serr = fmt.Errorf("udpio: SO_DOMAIN: %w", err)
				return
			}
			if domain == unix.AF_INET6 {
				set("IPV6_RECVPKTINFO", unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
			} else {
				set("IP_PKTINFO", unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
			}
		}
	})
	return errors.Join(err, serr)
}

// BufferSizes reports the receive and send buffer sizes the kernel granted
// c. Linux doubles a requested size to account for its bookkeeping and
// reports the doubled figure; that figure is returned as is.
func BufferSizes(c *net.UDPConn) (recv, send int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("udpio: %w", err)
	}
	var rerr, serr error
	err = rc.Control(func(fd uintptr) {
		recv, rerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		send, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	})
	if err = errors.Join(err, rerr, serr); err != nil {
		return 0, 0, fmt.Errorf("udpio: buffer sizes: %w", err)
	}
	return recv, send, nil
}

// AttachSteering installs a classic BPF program (SO_ATTACH_REUSEPORT_CBPF)
// on the reuseport group that group (from ListenGroup) belongs to: a
// datagram whose connection ID carries ordinal k < len(group) is delivered
// to group[k]; everything else goes where the kernel's hash sends it (see
// Steering). A server running one listener per socket therefore writes the
// index of the socket that accepted a session into the ordinal byte of the
// CIDs it issues for it. Attaching again replaces the program.
func AttachSteering(group []*net.UDPConn, s Steering) error {
	if len(group) == 0 {
		return fmt.Errorf("steering: empty group: %w", ErrConfig)
	}
	ins, err := s.program()
	if err != nil {
		return err
	}
	raw, err := assemble(ins)
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	rc, err := group[0].SyscallConn()
	if err != nil {
		return fmt.Errorf("udpio: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &prog)
	}); err != nil {
		return fmt.Errorf("udpio: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("udpio: SO_ATTACH_REUSEPORT_CBPF: %w", serr)
	}
	return nil
}
