// Package demo is the cidroute demo that `go run ./examples/demo` and
// `cidproxy -demo` run: two proxy replicas built from one configuration,
// three echo backends behind the PPv2 adapter, and clients with connection
// IDs that rebind like a NAT and switch replicas.
//
// The backends and clients are a Stack. This package's Records stack
// imports only the core module, so that a first `go run` compiles nothing
// it does not show (no TLS stack, Prometheus, eBPF or Kubernetes code); a
// test keeps it so. Package piondemo runs the same demo with pion/dtls v3.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// DefaultDuration is how long the demo sends traffic unless told
// otherwise: enough for every client to move through both replicas
// twice (a socket carries 10 messages, one every 50 ms).
const DefaultDuration = 2 * time.Second

// The replicas listen on two ports but share one public address (the VIP
// of a load balancer in production), which is part of the HRW key of new
// sessions and what the clients believe they talk to.
const (
	service     = "demo"
	seed        = 42
	numBackends = 3
	numReplicas = 2
	numClients  = 6
	pace        = 50 * time.Millisecond  // between one client's messages
	perSocket   = 10                     // messages per socket, then a rebinding
	firstWait   = 100 * time.Millisecond // for an echo; doubled on each resend
	tries       = 6                      // 100 ms … 3.2 s: 6.3 s in all before a message counts as lost
	handshake   = 20 * time.Second       // a busy machine's first handshake can be slow
	grace       = 30 * time.Second       // how long a slow client may run past the deadline to move once
)

// Public is the replicas' common public address, the peer address of
// every client session. It is on loopback because the clients are, and no
// socket binds it.
var Public = netip.MustParseAddrPort("127.0.0.2:5684")

// hooks let the tests change what the demo runs without changing what it
// checks: a misrouting replica, a client whose sockets reuse ports.
type hooks struct {
	// backends gives replica i its backend list.
	backends func(i int, list []registry.Backend) []registry.Backend
	// listen opens client id's sockets.
	listen func(id int) func() (*net.UDPConn, error)
	// handshake bounds the clients' handshakes.
	handshake time.Duration
}

var defaultHooks = hooks{
	backends: func(_ int, list []registry.Backend) []registry.Backend { return list },
	listen: func(int) func() (*net.UDPConn, error) {
		return func() (*net.UDPConn, error) {
			return net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		}
	},
	handshake: handshake,
}

// Run runs the demo with stack for about d, prints what happened to out,
// and returns an error if any session was not carried as its CID says.
// log receives the components' warnings and errors.
func Run(ctx context.Context, out io.Writer, log *slog.Logger, d time.Duration, stack Stack) error {
	return run(ctx, out, log, d, stack, defaultHooks)
}

func run(ctx context.Context, out io.Writer, log *slog.Logger, d time.Duration, stack Stack, h hooks) error {
	tr := &tracker{clients: map[int]*clientSeen{}}
	var backends []Backend
	defer func() {
		for _, b := range backends {
			b.Close()
		}
	}()
	var list []registry.Backend
	for ord := range uint8(numBackends) {
		b, err := stack.Backend(BackendConfig{
			Ordinal:          ord,
			Prefix:           fmt.Sprintf("%d|", ord), // so clients see who answered
			TrustedProxies:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
			HandshakeTimeout: handshake,
			Logger:           log.With("backend", ord),
			Observe:          func(m Message) { tr.observe(ord, m) },
		})
		if err != nil {
			return err
		}
		backends = append(backends, b)
		list = append(list, registry.Backend{Ordinal: ord, Addr: b.Addr()})
	}
	// Every replica runs the same service with the same seed and
	// backends (as cidproxy replicas do from one configuration), each on
	// a port of its own.
	svc := cidroute.Service{
		Name:         service,
		Listen:       netip.MustParseAddrPort("127.0.0.1:0"),
		RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, CIDLen: cidLen, PublicAddr: Public},
		Workers:      1,
	}
	var replicas []*cidroutetest.Proxy
	defer func() {
		for _, r := range replicas {
			r.Close()
		}
	}()
	var addrs []netip.AddrPort
	upstream := map[uint16]int{} // a replica's upstream port → the replica
	for i := range numReplicas {
		r, err := cidroutetest.New(seed, svc, h.backends(i, list)...)
		if err != nil {
			return fmt.Errorf("replica: %w", err)
		}
		replicas = append(replicas, r)
		addrs = append(addrs, r.Addr)
		ups, _ := r.UpstreamAddrs(service)
		for _, up := range ups {
			upstream[up.Port()] = i
		}
	}

	fmt.Fprintf(out, "cidroute demo: DTLS service %q at public address %v, served by proxy replicas A (%v) and B (%v)\n",
		service, Public, addrs[0], addrs[1])
	fmt.Fprintf(out, "  %d echo backends behind them, %d clients with connection IDs, %v of traffic\n  sessions: %s\n",
		numBackends, numClients, d, stack.Sessions)
	agree, total := replicasAgree(replicas)
	fmt.Fprintf(out, "routing step: both replicas pick the same backend for %d/%d new sessions from random client addresses (hrw_seed %d)\n", agree, total, seed)

	cs := runClients(ctx, addrs, d, stack, h)
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	var stopped []error
	for _, r := range replicas {
		stopped = append(stopped, r.Close()) // so that their counters are final
	}
	return report(out, tr, backends, replicas, stopped, upstream, cs, agree == total)
}

// replicasAgree runs the pure routing step of both replicas on the same
// ClientHello from many client addresses and counts identical choices.
func replicasAgree(rs []*cidroutetest.Proxy) (agree, total int) {
	hello, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, []byte("agree"))})
	if err != nil {
		panic(err) // a fixed, valid record
	}
	var hdr [64]byte
	r0, _ := rs[0].Router(service)
	r1, _ := rs[1].Router(service)
	v0, v1 := r0.View(nil), r1.View(nil)
	for i := range 1000 {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 7}), uint16(40000+i))
		d0, _ := r0.Forward(hdr[:0], hello, client, netip.Addr{}, &v0)
		d1, _ := r1.Forward(hdr[:0], hello, client, netip.Addr{}, &v1)
		total++
		if d0.Reason == cidroute.Forwarded && d1.Reason == d0.Reason && d1.Backend == d0.Backend {
			agree++
		}
	}
	return agree, total
}

// A client is one session with CID, and what it observed. It knows the
// CID the backend issued, so it knows which backend must answer, and
// every echo names the backend that sent it.
type client struct {
	cid        []byte
	ordinal    int         // from the CID; -1 if none was seen
	sent       int         // messages
	echoed     int         // answered by the backend its CID names
	answeredBy map[int]int // backend (from the echo) → messages
	lost       int         // unanswered after every try
	resent     int         // extra tries
	sockets    []socket    // in order; each one after the first is a rebinding
	err        error
}

// A socket is one source port of a client's session, and the replica it
// sent to.
type socket struct {
	port    uint16
	replica int
	sent    int
	echoed  int // answered by the backend the CID names
}

func runClients(ctx context.Context, replicas []netip.AddrPort, d time.Duration, stack Stack, h hooks) []*client {
	deadline := time.Now().Add(d)
	cs := make([]*client, numClients)
	var wg sync.WaitGroup
	for i := range cs {
		cs[i] = &client{ordinal: -1, answeredBy: map[int]int{}}
		wg.Go(func() { cs[i].run(ctx, i, replicas, deadline, stack, h.listen(i), h.handshake) })
	}
	wg.Wait()
	return cs
}

func (c *client) run(ctx context.Context, id int, replicas []netip.AddrPort, deadline time.Time, stack Stack, listen func() (*net.UDPConn, error), hsTimeout time.Duration) {
	via := id % len(replicas)
	sock, err := cidroutetest.ListenRebindFunc(listen, replicas[via], net.UDPAddrFromAddrPort(Public))
	if err != nil {
		c.err = err
		return
	}
	c.sockets = append(c.sockets, socket{port: sock.Local().Port(), replica: via})
	hctx, cancel := context.WithTimeout(ctx, hsTimeout)
	conn, err := stack.Client(hctx, sock, id)
	cancel()
	if err != nil {
		sock.Close()
		c.err = fmt.Errorf("handshake: %w", err)
		return
	}
	defer conn.Close()
	if cid := conn.CID(); len(cid) > 0 {
		c.cid, c.ordinal = cid, int(cid[0]) // ordinal-first: byte 0
	}
	buf := make([]byte, 2048)
	for seq := 0; ctx.Err() == nil; seq++ {
		// The run ends at the deadline, but not before the session has
		// moved at least once: a slow handshake on a busy machine can leave
		// too little time for a socket's worth of messages. Past the grace
		// period the checks fail.
		now := time.Now()
		if now.After(deadline.Add(grace)) || now.After(deadline) && len(c.sockets) > 1 {
			break
		}
		if seq > 0 && seq%perSocket == 0 { // NAT rebinding, and the load balancer picks the other replica
			via = (via + 1) % len(replicas)
			if err := sock.Rebind(replicas[via]); err != nil {
				c.err = err
				return
			}
			c.sockets = append(c.sockets, socket{port: sock.Local().Port(), replica: via})
		}
		s := &c.sockets[len(c.sockets)-1]
		msg := fmt.Sprintf("client %d message %d", id, seq)
		c.sent++
		s.sent++
		answered := false
		wait := firstWait
		for try := 0; try < tries && !answered; try, wait = try+1, wait*2 {
			if try > 0 {
				c.resent++
			}
			if err := conn.Write([]byte(msg)); err != nil {
				c.err = err
				return
			}
			until := time.Now().Add(wait)
			for !answered {
				n, err := conn.Read(buf, until)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break // resend
				}
				if err != nil {
					c.err = err
					return
				}
				ord, rest, _ := strings.Cut(string(buf[:n]), "|")
				if rest != msg {
					continue // a late echo of an earlier message's resent copy
				}
				answered = true
				o, err := strconv.Atoi(ord)
				if err != nil {
					o = -1
				}
				c.answeredBy[o]++
				if o == c.ordinal {
					c.echoed++
					s.echoed++
				}
			}
		}
		if !answered {
			c.lost++
			return // the verdict fails; more messages would only take longer
		}
		time.Sleep(pace)
	}
}

// replicas returns the replicas through which the client's messages were
// answered by its backend.
func (c *client) replicas() []int {
	var rs []int
	for _, s := range c.sockets {
		if s.echoed > 0 && !slices.Contains(rs, s.replica) {
			rs = append(rs, s.replica)
		}
	}
	slices.Sort(rs)
	return rs
}

// tracker records, on the backend side, which backend and session each
// client's messages reached.
type tracker struct {
	mu      sync.Mutex
	clients map[int]*clientSeen
	other   int // messages not from a demo client
}

type clientSeen struct {
	backends map[uint8]int
	sessions map[uint64]bool
}

func (t *tracker) observe(ord uint8, m Message) {
	var id, seq int
	_, err := fmt.Sscanf(string(m.Data), "client %d message %d", &id, &seq)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.other++
		return
	}
	s := t.clients[id]
	if s == nil {
		s = &clientSeen{backends: map[uint8]int{}, sessions: map[uint64]bool{}}
		t.clients[id] = s
	}
	s.backends[ord]++
	s.sessions[m.Session] = true
}

// report prints what each backend, replica and client saw, and returns an
// error naming every check that failed. The checks are about routing,
// each on what the table shows: the backend the CID names answered every
// message, through every socket and both replicas the client used, in one
// session. None depends on which source ports the kernel hands out.
func report(out io.Writer, tr *tracker, backends []Backend, replicas []*cidroutetest.Proxy, stopped []error, upstream map[uint16]int, cs []*client, agreed bool) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var fails []string
	failf := func(f string, a ...any) { fails = append(fails, fmt.Sprintf(f, a...)) }
	if !agreed {
		failf("the replicas' routing steps disagree on new sessions")
	}
	name := func(r int) string { return string(rune('A' + r)) }
	via := func(a backend.Addr) string {
		if r, ok := upstream[a.Proxy.Port()]; ok {
			return fmt.Sprintf("%v via %s", a.Client, name(r))
		}
		return fmt.Sprintf("%v via %v", a.Client, a.Proxy)
	}

	fmt.Fprintln(out, "\nbackends, and the sessions each owns (client address via replica, as the backend saw them, first → last):")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	var noSession uint64
	for _, b := range backends {
		r := b.Report()
		st := r.Adapter
		noSession += r.NoSession
		fmt.Fprintf(w, "backend %d\t%v\t%s\t%d datagrams from the proxies\t%d records for no session\n",
			b.Ordinal(), b.Addr(), plural(len(r.Sessions), "session"), st.AcceptedProxied, r.NoSession)
		for _, s := range r.Sessions {
			fmt.Fprintf(w, "  session %d\t%s → %s\t%s\t%s\n", s.ID, via(s.First), via(s.Last), plural(s.Messages, "message"), plural(s.Moves, "move"))
		}
		if st.AcceptedDirect > 0 || st.DroppedUntrusted > 0 {
			failf("backend %d got datagrams around the proxies", b.Ordinal())
		}
	}
	w.Flush()

	fmt.Fprintln(w, "\nreplica\tforward: received\tforwarded\tdropped\treverse: received\tforwarded\tdropped")
	for i, r := range replicas {
		if stopped[i] != nil {
			failf("replica %s stopped with an error: %v", name(i), stopped[i])
		}
		for _, s := range r.Stats() {
			f, v := s.Forward, s.Reverse
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%d\t%d\t%s\n", name(i), f.Received, f.Forwarded, drops(&f), v.Received, v.Forwarded, drops(&v))
			if !f.Balanced() || !v.Balanced() {
				failf("replica %s: counters do not balance", name(i))
			}
			if f.DroppedTotal()+v.DroppedTotal() != 0 {
				failf("replica %s dropped datagrams", name(i))
			}
		}
	}
	w.Flush()

	fmt.Fprintln(out, "\nclients, as each saw its session (byte 0 of a CID is the ordinal of the backend that issued it; a socket per rebinding, and the first):")
	fmt.Fprintln(w, "client\tCID\tCID names\tanswered by\tsockets\treplicas\techoed/sent\tresent")
	var sent, echoed, resent, rebindings int
	for i, c := range cs {
		if c.err != nil {
			failf("client %d: %v", i, c.err)
			continue
		}
		sent += c.sent
		echoed += c.echoed
		resent += c.resent
		rebindings += len(c.sockets) - 1
		var by []int
		for o := range c.answeredBy {
			by = append(by, o)
		}
		slices.Sort(by)
		var reps []string
		for _, r := range c.replicas() {
			reps = append(reps, name(r))
		}
		fmt.Fprintf(w, "%d\t%x\tbackend %d\tbackend %s\t%d\t%s\t%d/%d\t%d\n", i, c.cid, c.ordinal, join(by), len(c.sockets), strings.Join(reps, "+"), c.echoed, c.sent, c.resent)
		seen := tr.clients[i]
		unanswered := 0
		for _, s := range c.sockets {
			if s.echoed == 0 {
				unanswered++
			}
		}
		switch {
		case c.ordinal < 0:
			failf("client %d: no connection ID seen", i)
		case c.echoed != c.sent:
			failf("client %d: %d of %d messages answered by backend %d (the CID's), %d by another backend, %d unanswered", i, c.echoed, c.sent, c.ordinal, c.sent-c.echoed-c.lost, c.lost)
		case len(c.sockets) < 2 || unanswered > 0 || len(reps) != len(replicas):
			failf("client %d: the session did not continue through every socket and replica: %d sockets, %d of them unanswered, replicas %s", i, len(c.sockets), unanswered, strings.Join(reps, "+"))
		case seen == nil || len(seen.backends) != 1 || seen.backends[uint8(c.ordinal)] == 0:
			failf("client %d: messages reached backends other than %d", i, c.ordinal)
		case len(seen.sessions) != 1:
			failf("client %d: its messages reached %d sessions at backend %d: a rebinding started a new session", i, len(seen.sessions), c.ordinal)
		}
	}
	w.Flush()

	if tr.other > 0 {
		failf("%d messages reached a backend in an unexpected shape", tr.other)
	}
	fmt.Fprintf(out, "\n%d messages sent, %d echoed by the backend named in the session's CID, across %d rebindings (a new source port and the other replica)\n", sent, echoed, rebindings)
	if resent > 0 {
		fmt.Fprintf(out, "resends: %d (no echo within %v; the wait doubles on each try): slow round trips on a busy machine, not losses\n", resent, firstWait)
	}
	if noSession > 0 && len(fails) == 0 {
		// Not a check: a misroute shows as unanswered messages above.
		fmt.Fprintf(out, "records for no session: %d reached a backend without a session for their CID, yet every message was answered by its own backend\n", noSession)
	}
	if len(fails) > 0 {
		fmt.Fprintln(out, "result: FAILED")
		for _, f := range fails {
			fmt.Fprintln(out, "  -", f)
		}
		return fmt.Errorf("%d check(s) failed", len(fails))
	}
	fmt.Fprintln(out, "result: ok: every message was answered by the backend its session's CID names, through every socket and both replicas, in one session per client")
	return nil
}

func join(ords []int) string {
	s := make([]string, len(ords))
	for i, o := range ords {
		s[i] = strconv.Itoa(o)
	}
	return strings.Join(s, ",")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// drops formats a direction's drop total with its reasons.
func drops(c *cidroute.Counters) string {
	s := fmt.Sprint(c.DroppedTotal())
	for r := cidroute.Reason(1); r < cidroute.NumReasons; r++ {
		if n := c.Dropped[r]; n > 0 {
			s += fmt.Sprintf(" %s=%d", r, n)
		}
	}
	return s
}
