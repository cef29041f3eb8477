// Package testecho is the echo backend of the tests of forwarders (the
// pipeline, cidproxy, the benchmark's baselines): examples/echo in
// miniature, on one loopback socket with batched IO, stopped when the test
// ends. With PPv2 it is the one PROXY protocol v2 echo backend the tests
// share.
package testecho

import (
	"errors"
	"maps"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/udpio"
)

// Config configures an Echo. The zero value echoes every datagram to its
// sender unchanged.
type Config struct {
	// PPv2 answers a PROXY v2 framed datagram with the reverse header
	// (source = service, destination = client), then the payload;
	// datagrams without a valid PROXY header are counted Bad and get no
	// answer.
	PPv2 bool
	// Prefix goes in front of every echoed payload ("2|" tells which
	// backend answered).
	Prefix string
	// Batch is the number of datagrams per recvmmsg/sendmmsg (0 = 8), and
	// Buffer the SO_RCVBUF/SO_SNDBUF size (0 = the kernel's default).
	Batch, Buffer int
}

// An Echo is a running echo backend. Its methods are safe for concurrent
// use.
type Echo struct {
	cfg  Config
	conn *net.UDPConn

	mu      sync.Mutex
	clients map[netip.AddrPort]int // PPv2 source: the client as the proxy measured it
	senders map[netip.AddrPort]int // physical sender: the proxy, or the client itself

	received, echoed, bad atomic.Uint64
}

// Plain starts an echo that returns every datagram to its sender
// unchanged, for forwarders without PPv2, and returns its address.
func Plain(t testing.TB) netip.AddrPort { return Start(t, Config{}).Addr() }

// PPv2 starts a PROXY v2 echo (Config.PPv2) and returns its address.
func PPv2(t testing.TB) netip.AddrPort { return Start(t, Config{PPv2: true}).Addr() }

// Start starts an echo on 127.0.0.1 with cfg; it stops when the test ends.
func Start(t testing.TB, cfg Config) *Echo {
	t.Helper()
	if cfg.Batch == 0 {
		cfg.Batch = 8
	}
	g, err := udpio.ListenGroup("udp4", "127.0.0.1:0", 1, udpio.ListenConfig{RecvBuffer: cfg.Buffer, SendBuffer: cfg.Buffer})
	if err != nil {
		t.Fatal(err)
	}
	e := &Echo{cfg: cfg, conn: g[0], clients: map[netip.AddrPort]int{}, senders: map[netip.AddrPort]int{}}
	io, err := udpio.NewConn(e.conn, cfg.Batch)
	if err != nil {
		e.conn.Close()
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.serve(io)
	}()
	t.Cleanup(func() { e.conn.Close(); wg.Wait() })
	return e
}

func (e *Echo) serve(io *udpio.Conn) {
	in, out := make([]udpio.Message, e.cfg.Batch), make([]udpio.Message, e.cfg.Batch)
	for i := range in {
		in[i].Buf = make([]byte, 65535)
		out[i].Prefix = make([]byte, 0, ppv2.HeaderLen6+len(e.cfg.Prefix))
	}
	for {
		n, err := io.ReadBatch(in)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		e.received.Add(uint64(n))
		k := 0
		e.mu.Lock()
		for _, m := range in[:n] {
			o := &out[k]
			o.Addr, o.Buf, o.Prefix = m.Addr, m.Buf[:m.N], o.Prefix[:0]
			e.senders[m.Addr]++
			if e.cfg.PPv2 {
				h, off, err := ppv2.Parse(o.Buf)
				if err == nil && h.Command == ppv2.Proxy {
					o.Prefix, err = ppv2.AppendHeader(o.Prefix, ppv2.Header{Command: ppv2.Proxy, Src: h.Dst, Dst: h.Src})
				}
				if err != nil || h.Command != ppv2.Proxy {
					e.bad.Add(1)
					continue
				}
				e.clients[h.Src]++
				o.Buf = o.Buf[off:]
			}
			o.Prefix = append(o.Prefix, e.cfg.Prefix...)
			k++
		}
		e.mu.Unlock()
		if _, err := io.WriteBatch(out[:k]); errors.Is(err, net.ErrClosed) {
			return
		}
		for _, o := range out[:k] {
			if o.Err == nil {
				e.echoed.Add(1)
			}
		}
	}
}

// Addr returns the echo's address.
func (e *Echo) Addr() netip.AddrPort { return e.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// Conn returns the echo's socket, for a test that sends from the
// backend's own address (a compromised backend).
func (e *Echo) Conn() *net.UDPConn { return e.conn }

// Clients returns, for each client a PPv2 header named as its source, the
// number of datagrams.
func (e *Echo) Clients() map[netip.AddrPort]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.clients)
}

// Senders returns, for each physical sender (a proxy's upstream socket,
// or the client itself without a proxy), the number of datagrams.
func (e *Echo) Senders() map[netip.AddrPort]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.senders)
}

// Received counts datagrams read, Echoed the answers sent, and Bad the
// datagrams a PPv2 echo could not answer (no valid PROXY header).
func (e *Echo) Received() uint64 { return e.received.Load() }
func (e *Echo) Echoed() uint64   { return e.echoed.Load() }
func (e *Echo) Bad() uint64      { return e.bad.Load() }
