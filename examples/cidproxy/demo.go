package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/examples/internal/dtlsrec"
	"github.com/cidroute/cidroute/examples/internal/ppecho"
	"github.com/cidroute/cidroute/registry"
)

// The demo: two proxy replicas built from one configuration, three
// backends, and clients that send DTLS-shaped datagrams to both replicas in
// turn while changing their source port, as NAT rebinding does. The
// replicas listen on two ports but share one public address (the VIP of a
// load balancer in production), which is part of the HRW key of new
// sessions: so a ClientHello reaches the same backend through either.
const (
	demoService  = "demo"
	demoSeed     = 42
	demoBackends = 3
	demoReplicas = 2
	demoClients  = 6
	demoPace     = 25 * time.Millisecond // between one client's datagrams
	demoRebind   = 10                    // datagrams per source port
	demoHello    = 5                     // every 5th datagram is a ClientHello
)

// demoPublic is the replicas' common public address. It is on loopback
// because the clients are, and no socket binds it.
var demoPublic = netip.MustParseAddrPort("127.0.0.2:5684")

// demoBackend is what the demo needs of a backend. The PPv2 echo backends
// implement it; real DTLS servers can replace them without touching the
// clients or the report.
type demoBackend interface {
	Addr() netip.AddrPort
	Received() uint64
	Close() error
}

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
		b, err := ppecho.Listen(ppecho.Config{Observe: func(dg ppecho.Datagram) { tr.observe(ord, dg) }})
		if err != nil {
			return err
		}
		backends = append(backends, b)
		list = append(list, registry.Backend{Ordinal: ord, Addr: b.Addr()})
	}
	cfg := &config{Seed: demoSeed, Services: []serviceConfig{{
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
		r, err := newProxy(cfg, log)
		if err != nil {
			return fmt.Errorf("replica: %w", err)
		}
		replicas = append(replicas, r)
		a, _ := r.pipe.Addr(demoService)
		addrs = append(addrs, a)
		tr.mu.Lock()
		for _, up := range r.pipe.UpstreamAddrs(demoService) {
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

	fmt.Fprintf(out, "cidroute demo: DTLS service %q, public address %v, replicas A on %v and B on %v, %d PPv2 echo backends, %d clients, %v\n",
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
	hello := dtlsrec.AppendClientHello(nil, 0, []byte("agree"))
	var hdr [64]byte
	for i := range 1000 {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 7}), uint16(40000+i))
		d0, _ := rs[0].pipe.Router(demoService).Route(hdr[:0], hello, client)
		d1, _ := rs[1].pipe.Router(demoService).Route(hdr[:0], hello, client)
		total++
		if d0.Reason == cidroute.Forwarded && d1.Reason == d0.Reason && d1.Backend == d0.Backend {
			agree++
		}
	}
	return agree, total
}

// A demo client holds one DTLS-shaped session: a CID issued by the backend
// of ordinal Ordinal. It sends each datagram to the next replica in turn,
// moves to a new source port every demoRebind datagrams, and sends a
// ClientHello every demoHello datagrams.
type clientResult struct {
	ordinal          uint8
	cid              []byte
	sent, echoed     int
	bad, lost, ports int
	err              error
}

func runClients(ctx context.Context, replicas []netip.AddrPort, d time.Duration) []clientResult {
	deadline := time.Now().Add(d)
	res := make([]clientResult, demoClients)
	var wg sync.WaitGroup
	for i := range res {
		c := &res[i]
		c.ordinal = uint8(i % demoBackends)
		c.cid, c.err = dtls.OrdinalFirst{Length: cidroute.DefaultDTLSCIDLen}.AppendCID(nil, c.ordinal)
		if c.err != nil {
			continue
		}
		wg.Go(func() { c.run(ctx, replicas, deadline) })
	}
	wg.Wait()
	return res
}

func (c *clientResult) run(ctx context.Context, replicas []netip.AddrPort, deadline time.Time) {
	var conn *net.UDPConn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	body := make([]byte, 48)
	buf := make([]byte, 2048)
	var msg []byte
	for seq := uint64(0); time.Now().Before(deadline) && ctx.Err() == nil; seq++ {
		if seq%demoRebind == 0 { // NAT rebinding: a new source port
			if conn != nil {
				conn.Close()
			}
			var err error
			if conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0"))); err != nil {
				c.err = err
				return
			}
			c.ports++
		}
		rand.Read(body)
		if seq%demoHello == 0 {
			msg = dtlsrec.AppendClientHello(msg[:0], seq, body)
		} else {
			msg = dtlsrec.AppendCIDRecord(msg[:0], seq, c.cid, body)
		}
		to := replicas[seq%uint64(len(replicas))]
		if _, err := conn.WriteToUDPAddrPort(msg, to); err != nil {
			c.err = err
			return
		}
		c.sent++
		conn.SetReadDeadline(time.Now().Add(time.Second))
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		switch {
		case err != nil:
			c.lost++
		case from != to || !bytes.Equal(buf[:n], msg): // the reply comes from the replica it went through
			c.bad++
		default:
			c.echoed++
		}
		time.Sleep(demoPace)
	}
}

// tracker records, on the backend side, where every datagram arrived.
type tracker struct {
	mu            sync.Mutex
	replicaOfPort map[uint16]int // proxy upstream port → replica
	sessions      map[string]*sessionSeen
	hellos        map[netip.AddrPort]*helloSeen // by client address
	helloCount    []int                         // per backend
	other         int                           // unclassifiable payloads
}

type helloSeen struct {
	backends map[uint8]int
	replicas map[int]bool
}

type sessionSeen struct {
	backends map[uint8]int
	replicas map[int]bool
	ports    map[netip.AddrPort]bool
}

func newTracker() *tracker {
	return &tracker{
		replicaOfPort: map[uint16]int{},
		sessions:      map[string]*sessionSeen{},
		hellos:        map[netip.AddrPort]*helloSeen{},
		helloCount:    make([]int, demoBackends),
	}
}

func (t *tracker) observe(backend uint8, dg ppecho.Datagram) {
	c, err := dtls.Classify(dg.Payload, cidroute.DefaultDTLSCIDLen)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		t.other++
	case c.Kind == dtls.KindEstablished:
		s := t.sessions[string(c.CID)]
		if s == nil {
			s = &sessionSeen{backends: map[uint8]int{}, replicas: map[int]bool{}, ports: map[netip.AddrPort]bool{}}
			t.sessions[string(c.CID)] = s
		}
		s.backends[backend]++
		s.ports[dg.Client] = true
		if r, ok := t.replicaOfPort[dg.Proxy.Port()]; ok {
			s.replicas[r] = true
		}
	case c.ClientHello:
		h := t.hellos[dg.Client]
		if h == nil {
			h = &helloSeen{backends: map[uint8]int{}, replicas: map[int]bool{}}
			t.hellos[dg.Client] = h
		}
		h.backends[backend]++
		if r, ok := t.replicaOfPort[dg.Proxy.Port()]; ok {
			h.replicas[r] = true
		}
		t.helloCount[backend]++
	default:
		t.other++
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

	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nbackend\taddress\tdatagrams\tCID sessions\tClientHellos")
	for i, b := range backends {
		n := 0
		for _, s := range tr.sessions {
			if s.backends[uint8(i)] > 0 {
				n++
			}
		}
		fmt.Fprintf(w, "%d\t%v\t%d\t%d\t%d\n", i, b.Addr(), b.Received(), n, tr.helloCount[i])
	}
	w.Flush()

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

	fmt.Fprintln(w, "\nclient\tCID\tbackends seen\tdatagrams\tsource ports\treplicas\techoed/sent")
	var sent, echoed int
	for i, c := range cs {
		if c.err != nil {
			failf("client %d: %v", i, c.err)
			continue
		}
		sent += c.sent
		echoed += c.echoed
		s := tr.sessions[string(c.cid)]
		if s == nil {
			failf("client %d: no CID datagram reached a backend", i)
			continue
		}
		var seen []string
		total := 0
		for b, n := range s.backends {
			seen = append(seen, fmt.Sprint(b))
			total += n
		}
		slices.Sort(seen)
		var reps []string
		for r := range replicas {
			if s.replicas[r] {
				reps = append(reps, string(rune('A'+r)))
			}
		}
		fmt.Fprintf(w, "%d\t%x\t%s\t%d\t%d\t%s\t%d/%d\n", i, c.cid, strings.Join(seen, ","), total, len(s.ports), strings.Join(reps, "+"), c.echoed, c.sent)
		if len(s.ports) < 2 || len(s.replicas) != len(replicas) {
			failf("client %d: session did not cross ports and replicas", i)
		}
		if len(s.backends) != 1 || s.backends[c.ordinal] == 0 {
			failf("client %d: CID of ordinal %d reached backends %v", i, c.ordinal, seen)
		}
		if c.echoed != c.sent {
			failf("client %d: %d of %d echoes missing, %d wrong", i, c.lost, c.sent, c.bad)
		}
	}
	w.Flush()

	split, both := 0, 0
	for _, h := range tr.hellos {
		if len(h.backends) > 1 {
			split++
		}
		if len(h.replicas) == len(replicas) {
			both++
		}
	}
	if split > 0 {
		failf("%d client addresses had their ClientHellos spread over several backends", split)
	}
	if tr.other > 0 {
		failf("%d datagrams reached a backend in an unexpected shape", tr.other)
	}
	fmt.Fprintf(out, "\nclients: %d datagrams sent, %d echoed back by the replica they went through\n", sent, echoed)
	fmt.Fprintf(out, "ClientHellos: %d client addresses, %d of them through both replicas; each address reached one backend\n", len(tr.hellos), both)
	if len(fails) > 0 {
		fmt.Fprintln(out, "result: FAILED")
		for _, f := range fails {
			fmt.Fprintln(out, "  -", f)
		}
		return fmt.Errorf("%d check(s) failed", len(fails))
	}
	fmt.Fprintln(out, "result: ok: every CID session stayed on its backend across replicas and source-port changes, every client address's ClientHellos reached one backend through either replica, and no datagram was lost")
	return nil
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
