// Package ppecho is a UDP backend for the examples and their tests: it
// decodes the PROXY protocol v2 header in front of each datagram and echoes
// the payload back to the proxy that sent it, behind the reverse header
// (source = service, destination = client), so the proxy relays it to the
// client.
//
// It stands in for a real DTLS or QUIC server where only routing matters.
package ppecho

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/cidroute/cidroute/ppv2"
)

// A Datagram is what the backend learned from one received datagram.
// Payload is a view into the backend's read buffer, valid only during the
// Observe call.
type Datagram struct {
	Proxy   netip.AddrPort // physical sender: the proxy's upstream socket
	Client  netip.AddrPort // PPv2 source: the client as the proxy measured it
	Service netip.AddrPort // PPv2 destination: the address the client sent to
	Payload []byte
}

// Config configures a Backend.
type Config struct {
	// Addr is the UDP address to listen on ("127.0.0.1:0" when empty).
	Addr string
	// Observe, when set, is called for every datagram with a valid PROXY
	// header, before the echo, from the backend's single serving goroutine.
	Observe func(Datagram)
}

// A Backend echoes PPv2-framed datagrams. Its methods are safe for
// concurrent use.
type Backend struct {
	conn *net.UDPConn
	cfg  Config
	done chan struct{}
	once sync.Once

	received, echoed, bad atomic.Uint64
}

// Listen opens the backend's socket and starts serving it.
func Listen(cfg Config) (*Backend, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	ua, err := net.ResolveUDPAddr("udp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	c, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, err
	}
	b := &Backend{conn: c, cfg: cfg, done: make(chan struct{})}
	go b.serve()
	return b, nil
}

// Addr returns the backend's bound address.
func (b *Backend) Addr() netip.AddrPort {
	a := b.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// Received counts datagrams read, Echoed the replies sent, and Bad the
// datagrams without a valid PROXY v2 PROXY header (not echoed).
func (b *Backend) Received() uint64 { return b.received.Load() }
func (b *Backend) Echoed() uint64   { return b.echoed.Load() }
func (b *Backend) Bad() uint64      { return b.bad.Load() }

// Close stops the backend and waits for its goroutine. It is idempotent.
func (b *Backend) Close() error {
	b.once.Do(func() { b.conn.Close() })
	<-b.done
	return nil
}

func (b *Backend) serve() {
	defer close(b.done)
	buf := make([]byte, 65535)
	out := make([]byte, 0, 65535+ppv2.HeaderLen6)
	for {
		n, from, err := b.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		b.received.Add(1)
		h, off, err := ppv2.Parse(buf[:n])
		if err != nil || h.Command != ppv2.Proxy {
			b.bad.Add(1)
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		payload := buf[off:n]
		if b.cfg.Observe != nil {
			b.cfg.Observe(Datagram{Proxy: from, Client: h.Src, Service: h.Dst, Payload: payload})
		}
		out, err = ppv2.AppendHeader(out[:0], ppv2.Header{Command: ppv2.Proxy, Src: h.Dst, Dst: h.Src})
		if err != nil {
			b.bad.Add(1)
			continue
		}
		out = append(out, payload...)
		if _, err := b.conn.WriteToUDPAddrPort(out, from); err == nil {
			b.echoed.Add(1)
		}
	}
}
