package e2e

// A rolling restart of three backends under load, one at a time, the way a
// StatefulSet rolls (highest ordinal first): the registry says draining
// (the EndpointSlice's serving and terminating), the backend gets its
// SIGTERM (Drain), the registry says gone, and a new backend with the same
// ordinal starts at a new address.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/pion/transport/v5/netctx"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
	"github.com/cidroute/cidroute/registry"
)

// rollDrain is each backend's drain deadline in these tests: long enough
// for a short session (and the pinned one's five exchanges, 0.5 s) to
// finish on a loaded machine, short enough to cut the long ones. At 1.5 s
// a CI run under load cut the pinned session.
const rollDrain = 3 * time.Second

// rollLog collects what the clients saw.
type rollLog struct {
	mu       sync.Mutex
	failures []string // an exchange that got no answer
	onDrain  []string // a session that started on a draining backend (its ordinal draining from dial to answer)
	cuts     int      // sessions the clients saw closed by a draining backend
	closes   atomic.Int64
	refused  atomic.Int64 // QUIC handshakes refused by a backend beginning to drain
	redone   atomic.Int64 // DTLS handshakes started over (see dialDTLSAgain)
	movedOK  int          // of those, sessions opened again on another backend
	short    int          // short sessions completed
	exchange atomic.Int64
}

func (l *rollLog) fail(format string, args ...any) {
	l.mu.Lock()
	l.failures = append(l.failures, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

// rolled is a backend under the roll: the DTLS or the QUIC echo server.
type rolled interface {
	Addr() netip.AddrPort
	Drain(ctx context.Context) (cut int)
	Close() error
}

// roller runs the roll: three backends behind two replicas, the load, and
// what the clients saw.
type roller struct {
	t        *testing.T
	rs       []*replica
	bs       []registry.Backend
	listen   func(k uint8) rolled
	accepted func(rolled) int // sessions a backend has accepted, or nil when it cannot tell (see TestRollingRestartQUIC)
	draining atomic.Int32     // the ordinal draining now, -1 for none
	log      rollLog

	mu   sync.Mutex
	srvs []rolled
}

// newRoller starts backends 0, 1 and 2 with listen and two replicas of
// proto in front of them.
func newRoller(t *testing.T, proto cidroute.Protocol, listen func(k uint8) rolled, accepted func(rolled) int) *roller {
	r := &roller{t: t, listen: listen, accepted: accepted}
	r.draining.Store(-1)
	for k := range uint8(3) {
		r.srvs = append(r.srvs, listen(k))
		r.bs = append(r.bs, registry.Backend{Ordinal: k, Addr: r.srvs[k].Addr()})
	}
	r.rs = startReplicas(t, 2, proto, r.bs)
	return r
}

// load starts `long` long sessions (it returns once each has made its
// first exchange) and three workers of short sessions; stop ends them and
// waits.
func (r *roller) load(long int, longFn func(i int, stop <-chan struct{}, ready chan<- struct{}), shortFn func(w int, stop <-chan struct{})) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	ready := make(chan struct{}, long)
	for i := range long {
		wg.Go(func() { longFn(i, done, ready) })
	}
	for range long {
		<-ready
	}
	for w := range 3 {
		wg.Go(func() { shortFn(w, done) })
	}
	time.Sleep(300 * time.Millisecond)
	return func() { close(done); wg.Wait() }
}

// drain is backend k's SIGTERM: it drains for rollDrain and exits. It
// returns the sessions it cut and those it accepted meanwhile.
func (r *roller) drain(ctx context.Context, k uint8) (cut, accepted int) {
	r.mu.Lock()
	s := r.srvs[k]
	r.mu.Unlock()
	var before int
	if r.accepted != nil {
		before = r.accepted(s)
	}
	dctx, cancel := context.WithTimeout(ctx, rollDrain)
	cut = s.Drain(dctx)
	cancel()
	if r.accepted != nil {
		accepted = r.accepted(s) - before
	}
	s.Close()
	return cut, accepted
}

// roll restarts every backend in turn, as a StatefulSet rolls: the
// registry says draining, the backend drains and exits, the registry says
// gone, and a successor with the same ordinal starts at a new address.
// Before each drain, pin(k) opens a session on backend k and returns the
// rest of it, which runs during the drain and must lose nothing.
func (r *roller) roll(ctx context.Context, pin func(k uint8) func() error) (cut int) {
	t := r.t
	for k := len(r.bs) - 1; k >= 0; k-- {
		ord := uint8(k)
		rest := pin(ord)
		r.bs[k].State = registry.Draining
		setBackends(t, r.rs, r.bs)
		r.draining.Store(int32(k))
		pinned := make(chan error, 1)
		go func() { pinned <- rest() }()
		c, fresh := r.drain(ctx, ord)
		assert.NoError(t, <-pinned, "a session of backend %d that ended within its drain", k)
		assert.Zero(t, fresh, "backend %d accepted new sessions while draining", k)
		cut += c
		// The endpoint goes away after the process has exited, which
		// comes after its last close_notify or CONNECTION_CLOSE: the
		// proxies would drop one that arrived after "gone".
		want := int64(cut)
		assert.Eventually(t, func() bool { return r.log.closes.Load() >= want }, 10*time.Second, time.Millisecond,
			"the clients saw %d of the %d sessions cut so far closed", r.log.closes.Load(), want)
		gone := append(append([]registry.Backend(nil), r.bs[:k]...), r.bs[k+1:]...)
		setBackends(t, r.rs, gone)
		r.draining.Store(-1) // before its successor, of the same ordinal, is ready
		s := r.listen(ord)
		r.mu.Lock()
		r.srvs[k] = s
		r.mu.Unlock()
		r.bs[k] = registry.Backend{Ordinal: ord, Addr: s.Addr()}
		setBackends(t, r.rs, r.bs)
		t.Logf("backend %d: drained, %d sessions cut, restarted at %v", k, c, r.bs[k].Addr)
		time.Sleep(300 * time.Millisecond) // let the load reach the new one
	}
	return cut
}

func (r *roller) check(cut, long int) {
	t := r.t
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	t.Logf("%d exchanges, %d short sessions, %d long sessions of which %d cut and reopened elsewhere, %d handshakes refused (QUIC) or stalled (DTLS) and redone",
		r.log.exchange.Load(), r.log.short, long, r.log.cuts, r.log.refused.Load()+r.log.redone.Load())
	assert.Empty(t, r.log.failures, "exchanges without an answer")
	assert.Empty(t, r.log.onDrain, "sessions on a draining backend")
	assert.Equal(t, cut, r.log.cuts, "sessions the backends cut = sessions the clients saw cut")
	assert.Equal(t, r.log.cuts, r.log.movedOK, "every cut session reopened on another backend")
	assert.NotZero(t, r.log.cuts, "the roll cut some long sessions")
	assert.NotZero(t, r.log.short)
}

// TestRollingRestartDTLS: 12 long pion sessions and a stream of short ones
// through two replicas while the three DTLS backends roll. Short sessions
// finish within the drain and lose nothing; no session starts on a
// draining backend; the long sessions a backend still has at its drain
// deadline are closed with close_notify, counted, and their clients
// re-handshake onto another backend and go on.
func TestRollingRestartDTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var gen [3]int
	r := newRoller(t, cidroute.DTLS, func(k uint8) rolled {
		s, err := dtlsecho.Listen(dtlsecho.Config{Ordinal: k, PSK: testPSK, TrustedProxies: loopback,
			Direct: backend.DirectNoHandshake, Prefix: fmt.Sprintf("%d|", instance(k, gen[k]))})
		require.NoError(t, err)
		gen[k]++
		t.Cleanup(func() { s.Close() })
		return s
	}, func(s rolled) int {
		_, st := s.(*dtlsecho.Server).Stats()
		return int(st.NewSessions)
	})
	const long = 12
	stop := r.load(long, func(i int, stop <-chan struct{}, ready chan<- struct{}) { r.longDTLS(ctx, i, stop, ready) },
		func(w int, stop <-chan struct{}) { r.shortDTLS(ctx, w, stop) })
	cut := r.roll(ctx, func(k uint8) func() error {
		// A session on backend k, found by trying client addresses.
		for try := 0; ; try++ {
			require.Less(t, try, 100, "no client address hashes to backend %d", k)
			c, err := dialDTLS(ctx, r.rs[try%2].addr)
			require.NoError(t, err)
			if inst, _, err := dtlsAsk(c, "pin"); err == nil && ordinalOf(inst) == int(k) {
				return func() error {
					return pinnedExchanges(c, func(msg string) error {
						if _, closed, err := dtlsAsk(c, msg); err != nil || closed {
							return fmt.Errorf("closed by the server %v: %w", closed, err)
						}
						return nil
					})
				}
			}
			c.conn.Close()
		}
	})
	stop()
	r.check(cut, long)
}

// pinnedExchanges runs five exchanges 100 ms apart, well within rollDrain,
// then closes a DTLS session c (nil for QUIC, closed by the caller).
func pinnedExchanges(c *dtlsClient, exchange func(msg string) error) error {
	for m := range 5 {
		time.Sleep(100 * time.Millisecond)
		if err := exchange(fmt.Sprint("pinned #", m)); err != nil {
			return fmt.Errorf("exchange %d: %w", m, err)
		}
	}
	if c != nil {
		return c.conn.Close()
	}
	return nil
}

// instance names a backend process: its ordinal and how many ran with it
// before. A restarted backend has the ordinal of the one before, and
// another instance.
func instance(ord uint8, generation int) int { return generation*10 + int(ord) }

func ordinalOf(instance int) int { return instance % 10 }

// dtlsAsk is one exchange; it returns the instance that answered, and
// reports a close by the server apart.
func dtlsAsk(c *dtlsClient, msg string) (inst int, closed bool, err error) {
	reply, err := c.ask(msg, 1, 3*time.Second)
	if errors.Is(err, io.EOF) || errors.Is(err, pion.ErrConnClosed) || errors.Is(err, netctx.ErrClosing) {
		// close_notify: seen by Read, or pion closed the session (and
		// its socket) before our Write.
		return -1, true, nil
	}
	if err != nil {
		return -1, false, err
	}
	o, body, ok := strings.Cut(reply, "|")
	inst, perr := strconv.Atoi(o)
	if !ok || body != msg || perr != nil {
		return -1, false, fmt.Errorf("reply %q to %q", reply, msg)
	}
	return inst, false, nil
}

// longDTLS keeps a session busy until stop; when a draining backend closes
// it, it opens a new one and asks again.
func (r *roller) longDTLS(ctx context.Context, i int, stop <-chan struct{}, ready chan<- struct{}) {
	via := r.rs[i%2].addr
	c, err := dialDTLS(ctx, via)
	if err != nil {
		r.log.fail("long %d: %v", i, err)
		ready <- struct{}{}
		return
	}
	defer func() { c.conn.Close() }()
	inst := -1
	for n := 0; ; n++ {
		msg := fmt.Sprintf("long %d #%d", i, n)
		got, closed, err := dtlsAsk(c, msg)
		r.log.exchange.Add(1)
		if n == 0 {
			ready <- struct{}{}
		}
		switch {
		case err != nil:
			r.log.fail("long %d on instance %d: %v", i, inst, err)
			return
		case closed:
			r.log.closes.Add(1)
			old := inst
			c.conn.Close()
			if c, err = r.dialDTLSAgain(ctx, via); err != nil {
				r.log.fail("long %d: re-handshake after the cut: %v", i, err)
				return
			}
			got, _, err = dtlsAsk(c, msg)
			r.log.mu.Lock()
			r.log.cuts++
			if err == nil && got != old && got >= 0 {
				r.log.movedOK++
			}
			r.log.mu.Unlock()
			if err != nil {
				r.log.fail("long %d: after the cut: %v", i, err)
				return
			}
		}
		inst = got
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// dialDTLSAgain dials, and dials again once when the handshake does not
// complete: a cookie exchange that straddles a backend's switch to
// draining has its second ClientHello hashed to another backend, whose
// HelloVerifyRequest pion's client ignores (the same message_seq 0 as the
// first one's), so the handshake stalls; a client starts over, as this
// one does after 3 s.
func (r *roller) dialDTLSAgain(ctx context.Context, via netip.AddrPort) (*dtlsClient, error) {
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	c, err := dialDTLS(hctx, via)
	cancel()
	if err == nil {
		return c, nil
	}
	r.log.redone.Add(1)
	return dialDTLS(ctx, via)
}

// shortDTLS opens sessions of five exchanges, one after the other, until
// stop.
func (r *roller) shortDTLS(ctx context.Context, w int, stop <-chan struct{}) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		draining := int(r.draining.Load())
		c, err := r.dialDTLSAgain(ctx, r.rs[(w+n)%2].addr)
		if err != nil {
			r.log.fail("short %d/%d: %v", w, n, err)
			return
		}
		for m := range 5 {
			msg := fmt.Sprintf("short %d/%d #%d", w, n, m)
			got, closed, err := dtlsAsk(c, msg)
			r.log.exchange.Add(1)
			if err != nil || closed {
				r.log.fail("short %d/%d #%d: closed %v, %v", w, n, m, closed, err)
				break
			}
			if m == 0 && draining >= 0 && ordinalOf(got) == draining && int(r.draining.Load()) == draining {
				r.log.mu.Lock()
				r.log.onDrain = append(r.log.onDrain, msg)
				r.log.mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
		c.conn.Close()
		r.log.mu.Lock()
		r.log.short++
		r.log.mu.Unlock()
	}
}

// TestRollingRestartQUIC: the same roll for quic-go: 12 long connections
// and a stream of short ones; a draining backend's listener is closed (new
// connections go elsewhere), its connections run until they close or the
// deadline, which closes them with CONNECTION_CLOSE; those clients
// reconnect to another backend.
func TestRollingRestartQUIC(t *testing.T) {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// Each server records which messages it echoed: the instance that
	// served a connection is the one that echoed its first message.
	var served sync.Map // message → instance
	var gen [3]int
	// quic-go accepts a connection whose handshake completed before the
	// drain but was queued for Accept: counting accepted connections
	// cannot tell it from a new one. The clients check instead, and the
	// listener, closed by Drain, refuses handshakes in flight.
	r := newRoller(t, cidroute.QUIC, func(k uint8) rolled {
		inst := instance(k, gen[k])
		gen[k]++
		s, err := quicecho.Listen(quicecho.Config{Ordinal: k, TrustedProxies: loopback,
			Observe: func(m quicecho.Message) { served.Store(string(m.Data), inst) }})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}, nil)
	instanceOf := func(msg string) int {
		if o, ok := served.Load(msg); ok {
			return o.(int)
		}
		return -1
	}
	const long = 12
	stop := r.load(long, func(i int, stop <-chan struct{}, ready chan<- struct{}) { r.longQUIC(ctx, i, stop, ready, instanceOf) },
		func(w int, stop <-chan struct{}) { r.shortQUIC(ctx, w, stop, instanceOf) })
	cut := r.roll(ctx, func(k uint8) func() error {
		for try := 0; ; try++ {
			require.Less(t, try, 100, "no connection lands on backend %d", k)
			c, err := dialQUICConn(ctx, r.rs[try%2].addr)
			require.NoError(t, err)
			msg := fmt.Sprintf("pin %d/%d", k, try)
			if _, err := c.echo(msg); err == nil && ordinalOf(instanceOf(msg)) == int(k) {
				return func() error {
					defer c.close()
					return pinnedExchanges(nil, func(msg string) error { _, err := c.echo(msg); return err })
				}
			}
			c.close()
		}
	})
	stop()
	r.check(cut, long)
}

// quicConn is a client connection with one echo stream.
type quicConn struct {
	tr     *quic.Transport
	conn   *quic.Conn
	stream *quic.Stream
}

func dialQUICConn(ctx context.Context, via netip.AddrPort) (*quicConn, error) {
	c, err := dialQUICErr(ctx, via)
	if err != nil {
		return nil, err
	}
	s, err := c.conn.OpenStreamSync(ctx)
	if err != nil {
		c.close()
		return nil, err
	}
	c.stream = s
	return c, nil
}

func (c *quicConn) close() {
	c.conn.CloseWithError(0, "")
	c.tr.Close()
}

// echo is one exchange; closed reports a CONNECTION_CLOSE from the server.
func (c *quicConn) echo(msg string) (closed bool, err error) {
	b := []byte(msg)
	if _, err := c.stream.Write(b); err != nil {
		return isServerClose(err), err
	}
	c.stream.SetReadDeadline(time.Now().Add(3 * time.Second))
	got := make([]byte, len(b))
	if _, err := io.ReadFull(c.stream, got); err != nil {
		return isServerClose(err), err
	}
	if string(got) != msg {
		return false, fmt.Errorf("echo %q of %q", got, msg)
	}
	return false, nil
}

func isServerClose(err error) bool {
	var app *quic.ApplicationError
	return errors.As(err, &app) && app.Remote && app.ErrorMessage == "server draining"
}

func (r *roller) longQUIC(ctx context.Context, i int, stop <-chan struct{}, ready chan<- struct{}, instanceOf func(string) int) {
	via := r.rs[i%2].addr
	c, err := dialQUICConn(ctx, via)
	if err != nil {
		r.log.fail("long %d: %v", i, err)
		ready <- struct{}{}
		return
	}
	defer func() { c.close() }()
	inst := -1
	for n := 0; ; n++ {
		msg := fmt.Sprintf("long %d #%d", i, n)
		closed, err := c.echo(msg)
		r.log.exchange.Add(1)
		if n == 0 {
			ready <- struct{}{}
		}
		switch {
		case closed:
			r.log.closes.Add(1)
			old := inst
			c.close()
			if c, err = dialQUICConn(ctx, via); err != nil {
				r.log.fail("long %d: reconnect after the cut: %v", i, err)
				return
			}
			msg += " again"
			_, err = c.echo(msg)
			now := instanceOf(msg)
			r.log.mu.Lock()
			r.log.cuts++
			if err == nil && now >= 0 && now != old {
				r.log.movedOK++
			}
			r.log.mu.Unlock()
			if err != nil {
				r.log.fail("long %d: after the cut: %v", i, err)
				return
			}
		case err != nil:
			r.log.fail("long %d: %v", i, err)
			return
		}
		inst = instanceOf(msg)
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (r *roller) shortQUIC(ctx context.Context, w int, stop <-chan struct{}, instanceOf func(string) int) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		draining := int(r.draining.Load())
		c, err := r.openQUIC(ctx, r.rs[(w+n)%2].addr, fmt.Sprintf("short %d/%d #0", w, n))
		if err != nil {
			r.log.fail("short %d/%d: %v", w, n, err)
			return
		}
		for m := range 5 {
			msg := fmt.Sprintf("short %d/%d #%d", w, n, m)
			var closed bool
			if m > 0 { // openQUIC made the first exchange
				closed, err = c.echo(msg)
			}
			r.log.exchange.Add(1)
			if err != nil {
				r.log.fail("short %d/%d #%d: closed %v, %v", w, n, m, closed, err)
				break
			}
			if m == 0 && draining >= 0 && ordinalOf(instanceOf(msg)) == draining && int(r.draining.Load()) == draining {
				r.log.mu.Lock()
				r.log.onDrain = append(r.log.onDrain, msg)
				r.log.mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
		c.close()
		r.log.mu.Lock()
		r.log.short++
		r.log.mu.Unlock()
	}
}

// openQUIC dials and makes the first exchange, msg. A backend that begins
// to drain refuses the handshakes it has not completed
// (CONNECTION_REFUSED), also after the client's side of the handshake is
// done; the client dials again, once.
func (r *roller) openQUIC(ctx context.Context, via netip.AddrPort, msg string) (*quicConn, error) {
	var err error
	for try := range 2 {
		var c *quicConn
		if c, err = dialQUICConn(ctx, via); err == nil {
			if _, err = c.echo(msg); err == nil {
				return c, nil
			}
			c.close()
		}
		var te *quic.TransportError
		if try > 0 || !errors.As(err, &te) || te.ErrorCode != quic.ConnectionRefused || !te.Remote {
			break
		}
		r.log.refused.Add(1)
	}
	return nil, err
}

// dialQUICErr is dialQUIC for goroutines: it returns errors.
func dialQUICErr(ctx context.Context, via netip.AddrPort) (*quicConn, error) {
	sock, err := cidroutetest.ListenRebind(via, net.UDPAddrFromAddrPort(public))
	if err != nil {
		return nil, err
	}
	tr := &quic.Transport{Conn: sock}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := tr.Dial(dctx, net.UDPAddrFromAddrPort(public),
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicecho.DefaultALPN}}, &quic.Config{})
	if err != nil {
		tr.Close()
		return nil, fmt.Errorf("dial via %v: %w", via, err)
	}
	return &quicConn{tr: tr, conn: conn}, nil
}
