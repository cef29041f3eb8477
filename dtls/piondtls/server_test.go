package piondtls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/pion/dtls/v3/pkg/crypto/selfsign"
	"github.com/pion/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// echoListener serves ln: every session echoes "<ordinal>|msg" until it
// ends; it logs what the backend logs to logs.
type echoListener struct {
	ln *Listener
	bc *backend.Conn
	wg sync.WaitGroup
}

func newBackendConn(t *testing.T, logs io.Writer) *backend.Conn {
	t.Helper()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	if logs == nil {
		logs = io.Discard
	}
	bc, err := backend.New(udp, backend.Config{TrustedProxies: backend.DefaultTrustedProxies(), Protocol: backend.DTLS,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	return bc
}

func serveEcho(t *testing.T, ln *Listener, bc *backend.Conn) *echoListener {
	e := &echoListener{ln: ln, bc: bc}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				buf := make([]byte, 2048)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := fmt.Fprintf(c, "0|%s", buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		ln.Drain(canceled())
		e.wg.Wait()
		bc.Close()
	})
	return e
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// prober sends datagrams with a PPv2 header of its own choosing.
type prober struct {
	t *testing.T
	c *net.UDPConn
}

func newProber(t *testing.T) *prober {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &prober{t: t, c: c}
}

func (p *prober) send(to *backend.Conn, h ppv2.Header, payload []byte) {
	hdr, err := ppv2.AppendHeader(nil, h)
	require.NoError(p.t, err)
	_, err = p.c.WriteToUDPAddrPort(append(hdr, payload...), to.LocalAddr().(*net.UDPAddr).AddrPort())
	require.NoError(p.t, err)
}

// answer returns the first record of the next datagram, or ok false after
// a wait.
func (p *prober) answer(wait time.Duration) (dtls.Record, []byte, bool) {
	p.c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 4096)
	n, err := p.c.Read(buf)
	if err != nil {
		return dtls.Record{}, nil, false
	}
	r, _, err := dtls.ParseRecord(buf[:n], dtls.MinCIDLen)
	require.NoError(p.t, err, "%x", buf[:n])
	return r, buf[:n], true
}

const (
	typeHelloVerifyRequest = 3
)

// A ClientHello under a PPv2 LOCAL header (a proxy's health probe) draws
// pion's HelloVerifyRequest, or its ServerHello when the server skips the
// cookie exchange, straight back to the prober without a header, and
// leaves nothing behind: no session, nothing accepted, no log line. The
// same ClientHello through PROXY opens a session, as a client's would.
func TestProbeAnsweredWithoutSession(t *testing.T) {
	hello := testtool.ReadHex(t, "../testdata/pion_clienthello_1.hex")
	for _, skipCookie := range []bool{false, true} {
		t.Run(fmt.Sprintf("skip-cookie=%v", skipCookie), func(t *testing.T) {
			var logs testtool.SyncBuffer
			bc := newBackendConn(t, &logs)
			gen, err := Generator(0, 0)
			require.NoError(t, err)
			// The captured ClientHello offers ECDHE suites: a certificate
			// server answers it.
			cert, err := selfsign.GenerateSelfSigned()
			require.NoError(t, err)
			cfg := &pion.Config{Certificates: []tls.Certificate{cert}, ConnectionIDGenerator: gen,
				InsecureSkipVerifyHello: skipCookie,
				LoggerFactory:           &logging.DefaultLoggerFactory{Writer: &logs, DefaultLogLevel: logging.LogLevelInfo}}
			ln, err := Listen(bc, cfg)
			require.NoError(t, err)
			e := serveEcho(t, ln, bc)
			p := newProber(t)

			for range 3 {
				p.send(bc, ppv2.Header{Command: ppv2.Local}, hello)
				r, raw, ok := p.answer(5 * time.Second)
				require.True(t, ok, "no answer to the probe")
				assert.False(t, ppv2.Sniff(raw), "the answer to LOCAL carries no header")
				require.Equal(t, dtls.Handshake, r.Type)
				want := byte(typeHelloVerifyRequest)
				if skipCookie {
					want = typeServerHello
				}
				assert.Equal(t, want, r.Fragment[0], "handshake type")
				assert.True(t, p.nothingMore(), "one datagram per probe")
			}
			require.Eventually(t, func() bool { return e.ln.Stats().Probes == 3 }, 5*time.Second, time.Millisecond)
			st := e.ln.Stats()
			assert.Zero(t, st.NewSessions, "no session")
			assert.Zero(t, st.Sessions)
			assert.Zero(t, st.ProbesDropped)
			assert.Equal(t, uint64(3), bc.Stats().AcceptedLocal)
			assert.Empty(t, logs.String(), "no log line, from the backend or pion")

			// The same ClientHello through PROXY starts a session, whose
			// answer goes back through the proxy.
			p.send(bc, ppv2.Header{Command: ppv2.Proxy, Src: netip.MustParseAddrPort("192.0.2.1:1"), Dst: publicAddr}, hello)
			require.Eventually(t, func() bool { return e.ln.Stats().NewSessions == 1 }, 5*time.Second, time.Millisecond)
			p.c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := p.c.Read(make([]byte, 4096))
			require.NoError(t, err)
			require.NotZero(t, n)
			for !p.nothingMore() { // the rest of a ServerHello flight
			}

			// A draining backend (its session still open) does not answer
			// probes.
			dctx, stop := context.WithCancel(context.Background())
			drained := make(chan int)
			go func() { drained <- e.ln.Drain(dctx) }()
			require.Eventually(t, func() bool {
				e.ln.pl.mu.Lock()
				defer e.ln.pl.mu.Unlock()
				return e.ln.pl.closed
			}, 5*time.Second, time.Millisecond)
			p.send(bc, ppv2.Header{Command: ppv2.Local}, hello)
			_, _, ok := p.answer(200 * time.Millisecond)
			assert.False(t, ok, "answered while draining")
			require.Eventually(t, func() bool { return e.ln.Stats().ProbesDropped == 1 }, 5*time.Second, time.Millisecond)
			stop()
			assert.Equal(t, 0, <-drained, "a handshake left half-open is closed, not counted as a cut session")
		})
	}
}

func (p *prober) nothingMore() bool {
	_, _, ok := p.answer(50 * time.Millisecond)
	return !ok
}

// Without a ProbeConfig, a PacketListener drops probes and counts them;
// it never turns one into a session.
func TestProbeWithoutConfigDropped(t *testing.T) {
	bc := newBackendConn(t, nil)
	defer bc.Close()
	pl, err := NewPacketListener(bc, Config{CIDLen: 8})
	require.NoError(t, err)
	defer pl.Close()
	p := newProber(t)
	p.send(bc, ppv2.Header{Command: ppv2.Local}, testtool.ReadHex(t, "../testdata/pion_clienthello_1.hex"))
	require.Eventually(t, func() bool { return pl.Stats().ProbesDropped == 1 }, 5*time.Second, time.Millisecond)
	assert.Zero(t, pl.Stats().NewSessions)
	_, _, ok := p.answer(100 * time.Millisecond)
	assert.False(t, ok)
}

// pion v3.1's options form: a client with a CID is served, and the
// session is routed by its CID.
func TestListenWithOptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bc := newBackendConn(t, nil)
	gen, err := Generator(0, 0)
	require.NoError(t, err)
	ln, err := ListenWithOptions(bc, Config{CIDLen: 8},
		pion.WithPSK(func([]byte) ([]byte, error) { return []byte("cidroute-test-psk"), nil }),
		pion.WithPSKIdentityHint([]byte("cidroute")),
		pion.WithCipherSuites(pion.TLS_PSK_WITH_AES_128_CCM_8),
		pion.WithConnectionIDGenerator(gen))
	require.NoError(t, err)
	e := serveEcho(t, ln, bc)
	sc := newSwitchConn(t, bc.LocalAddr().(*net.UDPAddr).AddrPort())
	c := dial(t, ctx, sc)
	assert.Equal(t, "0|options", ask(t, c, "options"))
	ln.pl.mu.Lock()
	ncid := len(ln.pl.byCID)
	ln.pl.mu.Unlock()
	assert.Equal(t, 1, ncid, "the session is known by its CID")
	assert.Equal(t, uint64(1), e.ln.Stats().NewSessions)

	_, err = ListenWithOptions(bc, Config{}, pion.WithMTU(-1))
	assert.Error(t, err, "pion rejects the options")
}

// Drain: new sessions are refused at once; a session that ends within the
// grace period loses nothing; one still open at the deadline is closed
// with close_notify and counted.
func TestDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bc := newBackendConn(t, nil)
	gen, err := Generator(0, 0)
	require.NoError(t, err)
	cfg := pskConfig()
	cfg.ConnectionIDGenerator = gen
	ln, err := Listen(bc, cfg)
	require.NoError(t, err)
	e := serveEcho(t, ln, bc)
	to := bc.LocalAddr().(*net.UDPAddr).AddrPort()
	short := dial(t, ctx, newSwitchConn(t, to))
	long := dial(t, ctx, newSwitchConn(t, to))
	assert.Equal(t, "0|a", ask(t, short, "a"))
	assert.Equal(t, "0|b", ask(t, long, "b"))

	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	defer dcancel()
	cut := make(chan int, 1)
	go func() { cut <- ln.Drain(dctx) }()
	require.Eventually(t, func() bool {
		ln.pl.mu.Lock()
		defer ln.pl.mu.Unlock()
		return ln.pl.closed
	}, 5*time.Second, time.Millisecond)

	// Refused: a new client's handshake gets no answer.
	sc := newSwitchConn(t, to)
	ccfg := pskConfig()
	ccfg.PSKIdentityHint = []byte("client")
	fresh, err := pion.Client(sc, sc.remote, ccfg)
	require.NoError(t, err)
	hctx, hcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	require.Error(t, fresh.HandshakeContext(hctx), "a new session on a draining backend")
	hcancel()
	fresh.Close()
	assert.NotZero(t, e.ln.Stats().DroppedBacklog)

	// Served on: both sessions, until one ends.
	for i := range 5 {
		assert.Equal(t, fmt.Sprintf("0|s%d", i), ask(t, short, fmt.Sprintf("s%d", i)))
		assert.Equal(t, fmt.Sprintf("0|l%d", i), ask(t, long, fmt.Sprintf("l%d", i)))
	}
	require.NoError(t, short.Close())

	// At the deadline the long one is cut, with close_notify.
	assert.Equal(t, 1, <-cut)
	require.NoError(t, long.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = long.Read(make([]byte, 100))
	assert.True(t, errors.Is(err, io.EOF), "close_notify: %v", err)
	st := e.ln.Stats()
	assert.Equal(t, uint64(1), st.Cut)
	assert.Zero(t, e.ln.Stats().Sessions, "the half-open handshake of the refused client was never a session")
	assert.Equal(t, uint64(2), st.NewSessions)
	_, err = ln.Accept()
	assert.ErrorIs(t, err, ErrClosed)
	require.Eventually(t, func() bool {
		bc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		_, _, err := bc.ReadFrom(make([]byte, 10))
		return errors.Is(err, net.ErrClosed)
	}, 5*time.Second, 20*time.Millisecond, "the socket closes after the last session")
}

// Drain returns at once, cutting nothing, when no session is open.
func TestDrainIdle(t *testing.T) {
	bc := newBackendConn(t, nil)
	ln, err := Listen(bc, pskConfig())
	require.NoError(t, err)
	start := time.Now()
	assert.Zero(t, ln.Drain(context.Background()))
	assert.Less(t, time.Since(start), time.Second)
}
