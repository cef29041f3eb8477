//go:build linux

package udpio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// ListenGroup opens n UDP sockets bound to the same address with
// SO_REUSEPORT, so the kernel spreads datagrams over them (by 4-tuple hash,
// or by AttachSteering's program); serve each with its own goroutine and
// Conn. network is "udp", "udp4" or "udp6", as for net.ListenPacket. group[i]
// is socket i of the kernel's reuseport group, the index AttachSteering
// returns; closing one socket reorders the group, so close them together.
//
// The group refuses to share its address with sockets it did not open: the
// first socket is bound without SO_REUSEPORT, so that the bind fails with
// ErrInUse when another socket (or another process's reuseport group)
// holds the address, and gets SO_REUSEPORT only once bound; the others then
// join it. cfg.JoinExisting lifts the refusal for a restart handover. With
// n == 1 the socket keeps no SO_REUSEPORT unless cfg.Joinable. With port 0
// the kernel picks a port no other socket holds.
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
	ephemeral := portStr == "0" || portStr == ""
	// An ephemeral bind with SO_REUSEPORT could join a group of this user
	// that holds the port the kernel picks.
	join := cfg.JoinExisting && !ephemeral
	shared := n > 1 || cfg.Joinable || join
	group := make([]*net.UDPConn, 0, n)
	fail := func(err error) ([]*net.UDPConn, error) {
		for _, c := range group {
			c.Close()
		}
		return nil, err
	}
	for i := range n {
		// Socket 0 joins nothing unless asked; the others join socket 0.
		early := shared && (i > 0 || join)
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			return control(rc, cfg, early)
		}}
		pc, err := lc.ListenPacket(context.Background(), network, addr)
		if err != nil {
			if i == 0 && errors.Is(err, syscall.EADDRINUSE) {
				return fail(inUse(addr, join, err))
			}
			return fail(fmt.Errorf("udpio: listening on %s (socket %d of %d): %w", addr, i, n, err))
		}
		c := pc.(*net.UDPConn)
		group = append(group, c)
		if i == 0 && shared && !early {
			if err := setReusePort(c); err != nil {
				return fail(err)
			}
		}
		if i == 0 && ephemeral {
			port := c.LocalAddr().(*net.UDPAddr).Port
			addr = net.JoinHostPort(host, fmt.Sprint(port))
		}
	}
	return group, nil
}

// inUse explains an EADDRINUSE of the first socket.
func inUse(addr string, joining bool, err error) error {
	if joining {
		return fmt.Errorf("%w: %s is held by a socket without SO_REUSEPORT or of another user, which cannot be joined: %w", ErrInUse, addr, err)
	}
	return fmt.Errorf("%w: %s is held by another socket, not shared without ListenConfig.JoinExisting: %w", ErrInUse, addr, err)
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
// c (a *net.UDPConn, or a Conn). Linux doubles a requested size to account for its bookkeeping and
// reports the doubled figure; that figure is returned as is.
func BufferSizes(c syscall.Conn) (recv, send int, err error) {
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

// KernelDrops returns the number of datagrams the kernel dropped on c (a
// socket of this package or a *net.UDPConn) because its receive buffer
// was full (the socket's sk_drops, which SO_RXQ_OVFL would report with
// every datagram): one getsockopt(SO_MEMINFO) when asked, nothing on the
// receive path. The kernel keeps the count in 32 bits, so it wraps at
// 2³². Where the count cannot be read (an emulator that does not pass
// SO_MEMINFO through) the error wraps ErrNotSupported.
func KernelDrops(c syscall.Conn) (uint32, error) {
	m, err := ReadMemInfo(c)
	return m.Drops, err
}

// ReadMemInfo returns the state of c's receive queue, with one
// getsockopt(SO_MEMINFO). Where it cannot be read (an emulator that does
// not pass SO_MEMINFO through) the error wraps ErrNotSupported.
func ReadMemInfo(c syscall.Conn) (MemInfo, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return MemInfo{}, fmt.Errorf("udpio: %w", err)
	}
	var info [unix.SK_MEMINFO_VARS]uint32
	var serr error
	l := uint32(unsafe.Sizeof(info))
	err = rc.Control(func(fd uintptr) {
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0)
		if e != 0 {
			serr = e
		}
	})
	if err = errors.Join(err, serr); err != nil {
		return MemInfo{}, fmt.Errorf("udpio: SO_MEMINFO: %w", err)
	}
	// An emulator (qemu-user) may answer with less than the kernel's
	// array, as if the option were an int: no count, not a count of 0.
	if l < (unix.SK_MEMINFO_DROPS+1)*4 {
		return MemInfo{}, fmt.Errorf("udpio: SO_MEMINFO answered %d bytes: %w", l, ErrNotSupported)
	}
	return MemInfo{Queued: info[unix.SK_MEMINFO_RMEM_ALLOC], Limit: info[unix.SK_MEMINFO_RCVBUF],
		Drops: info[unix.SK_MEMINFO_DROPS]}, nil
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
	return setFilter(group[0], unix.SO_ATTACH_REUSEPORT_CBPF, "SO_ATTACH_REUSEPORT_CBPF", ins)
}

// AttachFilter installs f (SO_ATTACH_FILTER) on socket c (a socket of
// this package or a *net.UDPConn), replacing the filter it had, if any,
// at once: no datagram meets neither. f == nil removes the filter
// (SO_DETACH_FILTER; none attached is not an error).
func AttachFilter(c syscall.Conn, f *Filter) error {
	if f == nil {
		rc, err := c.SyscallConn()
		if err != nil {
			return fmt.Errorf("udpio: %w", err)
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
		}); err != nil {
			return fmt.Errorf("udpio: %w", err)
		}
		if serr != nil && serr != unix.ENOENT {
			return fmt.Errorf("udpio: SO_DETACH_FILTER: %w", serr)
		}
		return nil
	}
	ins, err := f.program()
	if err != nil {
		return err
	}
	return setFilter(c, unix.SO_ATTACH_FILTER, "SO_ATTACH_FILTER", ins)
}

// setFilter assembles ins and sets it on c as option opt (named name).
func setFilter(c syscall.Conn, opt int, name string, ins []bpf.Instruction) error {
	raw, err := assemble(ins)
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("udpio: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, opt, &prog)
	}); err != nil {
		return fmt.Errorf("udpio: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("udpio: %s: %w", name, serr)
	}
	return nil
}

// Configure applies cfg's buffer sizes and PacketInfo to a socket that
// is already bound, such as one inherited from another process, as
// ListenGroup applies them before bind (Joinable and JoinExisting do not
// apply). Call it before NewConn, which probes PacketInfo.
func Configure(c *net.UDPConn, cfg ListenConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("udpio: %w", err)
	}
	return control(rc, cfg, false)
}
