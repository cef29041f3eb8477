package proxyapp

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

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
)

// The demo: two proxy replicas built from one configuration, three
// pion/dtls v3 backends behind the PPv2 adapter, and pion/dtls v3 clients
// with connection IDs. Each client handshakes through one replica, then
// exchanges messages and, every demoRebind messages, moves to a fresh
// socket (a new source port, as NAT rebinding does) that sends to the
// other replica. The replicas listen on two ports but share one public
// address (the VIP of a load balancer in production), which is part of the
// HRW key of new sessions and what the clients believe they talk to.
const (
	demoService  = "demo"
	demoSeed     = 42
	demoBackends = 3
	demoReplicas = 2
	demoClients  = 6
	demoPace     = 50 * time.Millisecond // between one client's messages
	demoRebind   = 20                    // messages per socket
	demoWait     = 500 * time.Millisecond
	demoTries    = 4
	demoGrace    = 30 * time.Second // how long a slow client may run past the deadline to move once
)

var demoPSK = []byte("cidroute demo key")

// demoPublic is the replicas' common public address. It is on loopback
// because the clients are, and no socket binds it.
var demoPublic = netip.MustParseAddrPort("127.0.0.2:5684")

// demoBackend is what the demo needs of a backend: *dtlsecho.Server, the
// pion/dtls v3 server of examples/dtls-backend, run in-process.
type demoBackend interface {
	Addr() netip.AddrPort
	Ordinal() uint8
	Sessions() []dtlsecho.Session
	Stats() (backend.Stats, piondtls.Stats)
	Close() error
}

var _ demoBackend = (*dtlsecho.Server)(nil)

// demoReplicaBackends gives replica i its backend list; a test swaps two
// addresses on one replica to show that the verdict catches a misroute.
var demoReplicaBackends = func(i int, list []registry.Backend) []registry.Backend { return list }

func runDemo(ctx context.Context, out io.Writer, log *slog.Logger, d time.Duration) error {
	tr := newTracker()
	var backends []demoBackend
	defer func() {
		for _, b := range backends {
			b.Close()
		}
	}()
	var list []registry.Backend
	for ord := range uint8(demoBackends) {
		b, err := dtlsecho.Listen(dtlsecho.Config{
			Ordinal:        ord,
			PSK:            demoPSK,
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
			Direct:         backend.DirectNoHandshake, // no client around the proxies
			Prefix:         fmt.Sprintf("%d|", ord),   // so clients see who answered
			Logger:         log.With("backend", ord),
			Observe:        func(m dtlsecho.Message) { tr.observe(ord, m) },
		})
		if err != nil {
			return err
		}
		backends = append(backends, b)
		list = append(list, registry.Backend{Ordinal: ord, Addr: b.Addr()})
	}
	cfg := &proxyconfig.Config{Seed: demoSeed, Services: []proxyconfig.Service{{
		Name:     demoService,
		Protocol: cidroute.DTLS,
		Listen:   netip.MustParseAddrPort("127.0.0.1:0"), // each replica gets its own port
		Public:   demoPublic,
		CIDLen:   cidroute.DefaultDTLSCIDLen,
		Workers:  1,
		Backends: list,
	}}}
	var replicas []*proxy
	defer func() {
		for _, r := range replicas {
			r.close()
		}
	}()
	var addrs []netip.AddrPort
	for i := range demoReplicas {
		rcfg := *cfg
		rcfg.Services = []proxyconfig.Service{cfg.Services[0]}
		rcfg.Services[0].Backends = demoReplicaBackends(i, list)
		r, err := newProxy(ctx, &rcfg, log, Options{})
		if err != nil {
			return fmt.Errorf("replica: %w", err)
		}
		replicas = append(replicas, r)
		a, _ := r.pipe.Addr(demoService)
		addrs = append(addrs, a)
		tr.mu.Lock()
		ups, _ := r.pipe.UpstreamAddrs(demoService)
		for _, up := range ups {
			tr.replicaOfPort[up.Port()] = i
		}
		tr.mu.Unlock()
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range replicas {
		wg.Go(func() {
			if err := r.pipe.Run(runCtx); err != nil {
				log.Error("replica stopped", "err", err)
			}
		})
	}
	defer func() { stop(); wg.Wait() }()

	fmt.Fprintf(out, "cidroute demo: DTLS service %q, public address %v, replicas A on %v and B on %v, %d pion/dtls v3 backends, %d pion/dtls v3 clients with CID, %v\n",
		demoService, demoPublic, addrs[0], addrs[1], demoBackends, demoClients, d)
	agree, total := replicasAgree(replicas)
	fmt.Fprintf(out, "routing step: both replicas pick the same backend for %d/%d new sessions from random client addresses (hrw_seed %d)\n", agree, total, demoSeed)

	cs := runClients(ctx, addrs, d)
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	stop()
	wg.Wait()
	return demoReport(out, tr, backends, replicas, cs, agree == total)
}

// replicasAgree runs the pure routing step of both replicas on the same
// ClientHello from many client addresses and counts identical choices.
func replicasAgree(rs []*proxy) (agree, total int) {
	hello, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, []byte("agree"))})
	if err != nil {
		panic(err) // a fixed, valid record
	}
	var hdr [64]byte
	r0, _ := rs[0].pipe.Router(demoService)
	r1, _ := rs[1].pipe.Router(demoService)
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

// A demo client is one pion/dtls v3 session with CID. It learns the CID the
// backend issued from its own outgoing records (pion does not expose it),
// so it knows which backend must answer.
type clientResult struct {
	cid        []byte
	ordinal    int // from the CID; -1 if none was seen
	sent       int // messages
	echoed     int // answered by the backend its CID names
	wrong      int // answered by another backend
	lost       int // unanswered after demoTries
	resent     int // extra tries
	rebindings int
	err        error
}

func runClients(ctx context.Context, replicas []netip.AddrPort, d time.Duration) []clientResult {
	deadline := time.Now().Add(d)
	res := make([]clientResult, demoClients)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() { res[i].run(ctx, i, replicas, deadline) })
	}
	wg.Wait()
	return res
}

func (c *clientResult) run(ctx context.Context, id int, replicas []netip.AddrPort, deadline time.Time) {
	c.ordinal = -1
	via := id % len(replicas)
	sock, err := cidroutetest.ListenRebind(replicas[via], net.UDPAddrFromAddrPort(demoPublic))
	if err != nil {
		c.err = err
		return
	}
	sock.WatchDTLSCID(cidroute.DefaultDTLSCIDLen)
	conn, err := pion.Client(sock, net.UDPAddrFromAddrPort(demoPublic), dtlsecho.PSKClientConfig(demoPSK, fmt.Sprint("client-", id)))
	if err != nil {
		sock.Close()
		c.err = err
		return
	}
	defer conn.Close()
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = conn.HandshakeContext(hctx)
	cancel()
	if err != nil {
		c.err = fmt.Errorf("handshake: %w", err)
		return
	}
	buf := make([]byte, 2048)
	for seq := 0; ctx.Err() == nil; seq++ {
		// The run ends at the deadline, but not before the session has
		// moved at least once (a slow handshake on a busy machine leaves
		// too little time for a full socket's worth of messages), nor
		// while the last socket has carried a single message: the backend
		// reads the first record from a new address while pion still names
		// the old one (see the resent note), so only a second proves the
		// move to the tracker. Past the grace period the checks fail.
		now := time.Now()
		if now.After(deadline.Add(demoGrace)) {
			break
		}
		if now.After(deadline) && c.rebindings > 0 && seq%demoRebind != 1 {
			break
		}
		if seq > 0 && seq%demoRebind == 0 { // NAT rebinding, and the load balancer picks the other replica
			via = (via + 1) % len(replicas)
			if err := sock.Rebind(replicas[via]); err != nil {
				c.err = err
				return
			}
			c.rebindings++
		}
		msg := fmt.Sprintf("client %d message %d", id, seq)
		c.sent++
		answered := false
		for try := 0; try < demoTries && !answered; try++ {
			if try > 0 {
				c.resent++
			}
			if _, err := conn.Write([]byte(msg)); err != nil {
				c.err = err
				return
			}
			conn.SetReadDeadline(time.Now().Add(demoWait))
			for !answered {
				n, err := conn.Read(buf)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break // resend
				}
				if err != nil {
					c.err = err
					return
				}
				if c.ordinal < 0 {
					if cid := sock.CID(); len(cid) > 0 {
						c.cid, c.ordinal = cid, int(cid[0])
					}
				}
				ord, rest, _ := strings.Cut(string(buf[:n]), "|")
				if rest != msg {
					continue // a late echo of an earlier message's resent copy
				}
				if ord == strconv.Itoa(c.ordinal) {
					c.echoed++
				} else {
					c.wrong++
				}
				answered = true
			}
		}
		if !answered {
			c.lost++
		}
		time.Sleep(demoPace)
	}
}

// tracker records, on the backend side, where every message arrived.
type tracker struct {
	mu            sync.Mutex
	replicaOfPort map[uint16]int // proxy upstream port → replica
	clients       map[int]*clientSeen
	other         int // messages not from a demo client
}

type clientSeen struct {
	backends map[uint8]int
	sessions map[uint64]bool
	replicas map[int]bool
	ports    map[netip.AddrPort]bool
}

func newTracker() *tracker {
	return &tracker{replicaOfPort: map[uint16]int{}, clients: map[int]*clientSeen{}}
}

func (t *tracker) observe(ord uint8, m dtlsecho.Message) {
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
		s = &clientSeen{backends: map[uint8]int{}, sessions: map[uint64]bool{}, replicas: map[int]bool{}, ports: map[netip.AddrPort]bool{}}
		t.clients[id] = s
	}
	s.backends[ord]++
	s.sessions[m.Session] = true
	s.ports[m.From.Client] = true
	if r, ok := t.replicaOfPort[m.From.Proxy.Port()]; ok {
		s.replicas[r] = true
	}
}

// demoReport prints what each backend, replica and session saw, and
// returns an error naming every check that failed.
func demoReport(out io.Writer, tr *tracker, backends []demoBackend, replicas []*proxy, cs []clientResult, agreed bool) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var fails []string
	failf := func(f string, a ...any) { fails = append(fails, fmt.Sprintf(f, a...)) }
	if !agreed {
		failf("the replicas' routing steps disagree on new sessions")
	}
	replicaName := func(proxy netip.AddrPort) string {
		if r, ok := tr.replicaOfPort[proxy.Port()]; ok {
			return string(rune('A' + r))
		}
		return proxy.String()
	}

	fmt.Fprintln(out, "\nper backend, the sessions it owns (claimed client address via measured proxy, first → last):")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	var sessions int
	for _, b := range backends {
		st, dm := b.Stats()
		ss := b.Sessions()
		sessions += len(ss)
		fmt.Fprintf(w, "backend %d\t%v\t%s\t%d datagrams via proxies, %d direct\t%d records for no session\n",
			b.Ordinal(), b.Addr(), plural(len(ss), "session"), st.AcceptedProxied, st.AcceptedDirect, dm.DroppedNoSession)
		for _, s := range ss {
			fmt.Fprintf(w, "  session %d\t%v via %s → %v via %s\t%s\t%s\n",
				s.ID, s.First.Client, replicaName(s.First.Proxy), s.Last.Client, replicaName(s.Last.Proxy), plural(s.Messages, "message"), plural(s.Moves, "move"))
		}
		if st.AcceptedDirect > 0 || st.DroppedUntrusted > 0 {
			failf("backend %d got datagrams around the proxies", b.Ordinal())
		}
		if dm.DroppedNoSession > 0 {
			failf("backend %d got %d records of sessions it does not own", b.Ordinal(), dm.DroppedNoSession)
		}
	}
	w.Flush()
	if sessions != len(cs) {
		failf("%d backend sessions for %d clients: a rebinding started a new session", sessions, len(cs))
	}

	fmt.Fprintln(w, "\nreplica\tforward: received\tforwarded\tdropped\treverse: received\tforwarded\tdropped")
	for i, r := range replicas {
		for _, s := range r.pipe.Stats() {
			f, v := s.Forward, s.Reverse
			fmt.Fprintf(w, "%c\t%d\t%d\t%s\t%d\t%d\t%s\n", 'A'+i, f.Received, f.Forwarded, drops(&f), v.Received, v.Forwarded, drops(&v))
			if !f.Balanced() || !v.Balanced() {
				failf("replica %c: counters do not balance", 'A'+i)
			}
			if f.DroppedTotal()+v.DroppedTotal() != 0 {
				failf("replica %c dropped datagrams", 'A'+i)
			}
		}
	}
	w.Flush()

	fmt.Fprintln(w, "\nclient\tCID\tbackend (CID)\tanswered by\tsource ports\treplicas\techoed/sent\tresent")
	var sent, echoed, resent, rebindings int
	for i, c := range cs {
		if c.err != nil {
			failf("client %d: %v", i, c.err)
			continue
		}
		sent += c.sent
		echoed += c.echoed
		resent += c.resent
		rebindings += c.rebindings
		s := tr.clients[i]
		if s == nil {
			failf("client %d: no message reached a backend", i)
			continue
		}
		var seen []string
		for b := range s.backends {
			seen = append(seen, fmt.Sprint(b))
		}
		slices.Sort(seen)
		var reps []string
		for r := range replicas {
			if s.replicas[r] {
				reps = append(reps, string(rune('A'+r)))
			}
		}
		fmt.Fprintf(w, "%d\t%x\t%d\t%s\t%d\t%s\t%d/%d\t%d\n", i, c.cid, c.ordinal, strings.Join(seen, ","), len(s.ports), strings.Join(reps, "+"), c.echoed, c.sent, c.resent)
		switch {
		case len(s.backends) != 1 || s.backends[uint8(c.ordinal)] == 0:
			failf("client %d: session of ordinal %d reached backends %v", i, c.ordinal, seen)
		case len(s.sessions) != 1:
			failf("client %d: %d backend sessions", i, len(s.sessions))
		case c.wrong > 0 || c.lost > 0 || c.echoed != c.sent:
			failf("client %d: %d of %d messages answered by its backend, %d by another, %d lost", i, c.echoed, c.sent, c.wrong, c.lost)
		case c.rebindings < 1 || len(s.ports) != c.rebindings+1 || len(s.replicas) != len(replicas):
			failf("client %d: session did not cross ports and replicas", i)
		}
	}
	w.Flush()

	if tr.other > 0 {
		failf("%d messages reached a backend in an unexpected shape", tr.other)
	}
	fmt.Fprintf(out, "\nclients: %d messages sent, %d echoed by the backend named in the session's CID, across %d rebindings (new source port and other replica)\n", sent, echoed, rebindings)
	if resent > 0 {
		fmt.Fprintf(out, "resent after %v without an echo: %d (pion/dtls v3.1.15 hands a record to the server before it moves the session to the record's new address, so the echo of the first record after a rebinding can leave for the old one)\n", demoWait, resent)
	}
	if len(fails) > 0 {
		fmt.Fprintln(out, "result: FAILED")
		for _, f := range fails {
			fmt.Fprintln(out, "  -", f)
		}
		return fmt.Errorf("%d check(s) failed", len(fails))
	}
	fmt.Fprintln(out, "result: ok: every rebound session continued on its backend, through either replica, with one session per client and no datagram dropped")
	return nil
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
