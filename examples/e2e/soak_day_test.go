package e2e

// "A day in the life" (issue 16 §5): the everyday changes an operator
// makes, in sequence, under one population of clients that never stops.
// Two cidproxy replicas (processes, as an operator runs them) in front of
// three pion/dtls v3 and three quic-go backends; 50 pion clients that
// rebind to a new port every few messages and 50 quic-go clients that
// migrate to a new path every few, both through a load balancer modelled
// as rendezvous hashing of the client's port over the live replicas. Then:
//
//  1. a replica killed (SIGKILL) and restarted;
//  2. a rolling restart of the backends (draining, drained, gone, a new
//     process at a new address, one ordinal at a time);
//  3. a proxy binary upgrade, replica by replica (-handover);
//  4. a configuration reload adding a backend and draining another
//     (SIGHUP), then new sessions;
//  5. a third replica (scale-out), the balancer re-hashing.
//
// Each step reports lost messages (0 where the design promises it, the
// bound elsewhere), failed sessions, re-handshakes and every replica's
// counter identity (received = forwarded + Σ dropped, per service and
// direction). `go test` runs a short day; -soak lengthens each step:
//
//	go test ./examples/e2e -run TestSoakDayInTheLife -soak=2m -v

import (
	"context"
	"crypto/tls"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
	"github.com/cidroute/cidroute/registry"
)

// dayScale sizes the day: clients, how long each step runs, the pause
// between a client's messages, and the backends' drain deadline.
type dayScale struct {
	DTLS, QUIC   int
	Step         time.Duration
	Pause        time.Duration
	Drain        time.Duration
	RebindEvery  int // pion: a new source port every this many messages
	MigrateEvery int // quic-go: a new path every this many messages
}

func dayScaleFor() dayScale {
	sc := dayScale{DTLS: 50, QUIC: 50, Step: time.Second, Pause: 40 * time.Millisecond, Drain: time.Second, RebindEvery: 10, MigrateEvery: 15}
	if *soakFor > 0 {
		sc.Step = max((*soakFor / 10).Round(100*time.Millisecond), 2*time.Second)
		sc.Drain = 3 * time.Second
	}
	return sc
}

// A dayReplica is one replica slot (A, B, C): its ports, files and the
// processes that held it, in turn.
type dayReplica struct {
	name         string
	dtls, quic   netip.AddrPort
	metrics      string
	conf, sock   string
	procs        []*cidproxyProc // every incarnation, the current last
	killed       []bool          // by incarnation: ended by SIGKILL
	alive        bool
	bin, version string
}

func (r *dayReplica) cur() *cidproxyProc { return r.procs[len(r.procs)-1] }

// dayCluster is the day's world: replicas, backends, the balancer.
type dayCluster struct {
	t    *testing.T
	sc   dayScale
	bins proxyBuilds
	dir  string

	mu       sync.Mutex
	replicas []*dayReplica
	dtlsSrv  map[uint8]*dtlsecho.Server
	quicSrv  map[uint8]*quicecho.Server
	oldDTLS  []*dtlsecho.Server
	oldQUIC  []*quicecho.Server
	dtlsList []registry.Backend
	quicList []registry.Backend
	live     []*dayReplica // the balancer's view
	draining map[uint8]bool
	failures []string // why sessions failed, for the log
	gate     *dayGate
}

// failed notes why a client's session failed.
func (d *dayCluster) failed(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.failures) < 400 {
		d.failures = append(d.failures, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
}

func newDay(t *testing.T, sc dayScale, bins proxyBuilds) *dayCluster {
	d := &dayCluster{t: t, sc: sc, bins: bins, dir: t.TempDir(), gate: newGate(),
		dtlsSrv: map[uint8]*dtlsecho.Server{}, quicSrv: map[uint8]*quicecho.Server{}, draining: map[uint8]bool{}}
	for ord := range uint8(3) {
		d.startBackends(ord)
	}
	t.Cleanup(d.close)
	for range 2 {
		d.addReplica(bins.v1, "e2e-v1")
	}
	return d
}

// startBackends starts the DTLS and the QUIC backend of ord (new
// processes, new addresses) and lists them ready.
func (d *dayCluster) startBackends(ord uint8) {
	t := d.t
	ds, err := dtlsecho.Listen(dtlsecho.Config{Ordinal: ord, PSK: soakPSK, TrustedProxies: soakTrusted,
		Direct: backend.DirectNoHandshake, Prefix: fmt.Sprintf("%d|", ord), HandshakeTimeout: 3 * time.Second})
	require.NoError(t, err)
	qs, err := quicecho.Listen(quicecho.Config{Ordinal: ord, TrustedProxies: soakTrusted, Direct: backend.DirectNoHandshake})
	require.NoError(t, err)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dtlsSrv[ord], d.quicSrv[ord] = ds, qs
	d.dtlsList = setBackend(d.dtlsList, registry.Backend{Ordinal: ord, Addr: ds.Addr()})
	d.quicList = setBackend(d.quicList, registry.Backend{Ordinal: ord, Addr: qs.Addr()})
}

func setBackend(list []registry.Backend, b registry.Backend) []registry.Backend {
	list = slices.DeleteFunc(slices.Clone(list), func(x registry.Backend) bool { return x.Ordinal == b.Ordinal })
	list = append(list, b)
	slices.SortFunc(list, func(a, b registry.Backend) int { return int(a.Ordinal) - int(b.Ordinal) })
	return list
}

// setState sets ord's state in both lists (gone: removed).
func (d *dayCluster) setState(ord uint8, st registry.State) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range []*[]registry.Backend{&d.dtlsList, &d.quicList} {
		for i := range *l {
			if (*l)[i].Ordinal == ord {
				(*l)[i].State = st
			}
		}
		if st == registry.Gone {
			*l = slices.DeleteFunc(*l, func(b registry.Backend) bool { return b.Ordinal == ord })
		}
	}
}

// markDraining records which backends the replicas now know as draining
// (after reload), for the check that no new session lands on one.
func (d *dayCluster) markDraining() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.draining)
	for _, b := range d.dtlsList {
		if b.State == registry.Draining {
			d.draining[b.Ordinal] = true
		}
	}
}

func (d *dayCluster) isDraining(ord int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return ord >= 0 && d.draining[uint8(ord)]
}

// drainingSet returns the backends the replicas know as draining now.
func (d *dayCluster) drainingSet() map[uint8]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.draining)
}

// landedDraining reports a new session on ord that the replicas knew as
// draining before its dial began (before) and still do: one they had to
// keep it off. A backend that starts draining during the dial may take
// it, since its first flight was routed before. It notes the session
// among the step's failures.
func (d *dayCluster) landedDraining(before map[uint8]bool, ord int, what string) bool {
	if ord < 0 || !before[uint8(ord)] || !d.isDraining(ord) {
		return false
	}
	d.failed("%s: new session on ordinal %d, draining since before its dial", what, ord)
	return true
}

func jsonList(bs []registry.Backend) string {
	var out []string
	for _, b := range bs {
		out = append(out, fmt.Sprintf(`{"ordinal": %d, "address": "%v", "state": "%v"}`, b.Ordinal, b.Addr, b.State))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// writeConf writes replica r's configuration: the cluster's lists.
func (d *dayCluster) writeConf(r *dayReplica) {
	d.mu.Lock()
	dl, ql := jsonList(d.dtlsList), jsonList(d.quicList)
	d.mu.Unlock()
	writeFileAtomic(d.t, r.conf, fmt.Sprintf(`{"hrw_seed": %d, "metrics_listen": %q, "services": [
		{"name": "dtls", "protocol": "dtls", "listen": "%v", "workers": 2, "recv_buffer": 4194304, "send_buffer": 4194304, "backends": %s},
		{"name": "quic", "protocol": "quic", "listen": "%v", "workers": 2, "recv_buffer": 4194304, "send_buffer": 4194304, "backends": %s}]}`,
		soakSeed, r.metrics, r.dtls, dl, r.quic, ql))
}

// addReplica starts a new replica slot.
func (d *dayCluster) addReplica(bin, version string) *dayReplica {
	d.mu.Lock()
	name := string(rune('A' + len(d.replicas)))
	d.mu.Unlock()
	r := &dayReplica{name: name, dtls: freeService(d.t), quic: freeService(d.t),
		metrics: fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(d.t, "tcp")),
		conf:    filepath.Join(d.dir, name+".json"), sock: filepath.Join(d.dir, name+".sock")}
	d.writeConf(r)
	d.mu.Lock()
	d.replicas = append(d.replicas, r)
	d.mu.Unlock()
	d.startProc(r, bin, version)
	d.setLive(r, true)
	return r
}

// startProc starts a process in slot r (a first start, a restart after
// a kill, or a successor that takes r over by -handover).
func (d *dayCluster) startProc(r *dayReplica, bin, version string) *cidproxyProc {
	p := startCidproxy(d.t, fmt.Sprintf("%s%d (%s)", r.name, len(r.procs), version), bin, r.metrics, "-handover", r.sock, "-config", r.conf)
	r.procs = append(r.procs, p)
	r.killed = append(r.killed, false)
	r.bin, r.version = bin, version
	p.waitLog(d.t, "handover socket listening", 15*time.Second)
	return p
}

// reload rewrites every live replica's configuration and sends SIGHUP,
// waiting until each has applied it.
func (d *dayCluster) reload() {
	t := d.t
	for _, r := range d.liveReplicas() {
		d.writeConf(r)
		p := r.cur()
		want := p.scrape(t)[`cidroute_config_reloads_total{result="applied"}`] + 1
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
		waitUntil(t, 10*time.Second, r.name+" reload", func() bool {
			return p.scrape(t)[`cidroute_config_reloads_total{result="applied"}`] == want
		})
	}
	d.markDraining()
}

// The balancer: rendezvous hashing of a client's port over the live
// replicas, so that a replica's death moves only its clients and a new
// one takes about 1/n of them.
func (d *dayCluster) pick(port uint16, quic bool) netip.AddrPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best *dayReplica
	var bestScore uint64
	for _, r := range d.live {
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s", port, r.name)
		if s := h.Sum64(); best == nil || s > bestScore {
			best, bestScore = r, s
		}
	}
	if quic {
		return best.quic
	}
	return best.dtls
}

func (d *dayCluster) setLive(r *dayReplica, alive bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r.alive = alive
	d.live = slices.DeleteFunc(d.live, func(x *dayReplica) bool { return x == r })
	if alive {
		d.live = append(d.live, r)
	}
}

// kernelDrops is what the kernel dropped, for want of buffer space, at
// every replica slot's service sockets (they outlive a handover).
func (d *dayCluster) kernelDrops() uint64 {
	d.mu.Lock()
	ports := map[uint16]bool{}
	for _, r := range d.replicas {
		ports[r.dtls.Port()], ports[r.quic.Port()] = true, true
	}
	d.mu.Unlock()
	return soakSockDrops(ports)
}

func (d *dayCluster) liveReplicas() []*dayReplica {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.live)
}

func (d *dayCluster) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.dtlsSrv {
		s.Close()
	}
	for _, s := range d.quicSrv {
		s.Close()
	}
}

// identity checks a replica's current process: a scrape where every
// service and direction balances. It returns the sums over services and
// directions (received, forwarded) and the detail.
func (d *dayCluster) identity(r *dayReplica) (rx, fw float64, detail string) {
	t := d.t
	p := r.cur()
	var m map[string]float64
	ok := waitFor(10*time.Second, func() bool {
		m = p.scrape(t)
		return imbalance(m) == ""
	})
	require.True(t, ok, "replica %s: counters do not balance: %s", r.name, imbalance(m))
	var parts []string
	for _, svc := range []string{"dtls", "quic"} {
		for _, dir := range []string{"forward", "reverse"} {
			sr := m[fmt.Sprintf(`cidroute_datagrams_received_total{direction="%s",path="socket",service="%s"}`, dir, svc)]
			sf := m[fmt.Sprintf(`cidroute_datagrams_total{direction="%s",outcome="forwarded",path="socket",reason="",service="%s"}`, dir, svc)]
			rx, fw = rx+sr, fw+sf
			part := fmt.Sprintf("%s %s %.0f = %.0f + %.0f", svc, dir[:3], sr, sf, sr-sf)
			var why []string
			for k, v := range m {
				if v > 0 && strings.HasPrefix(k, "cidroute_datagrams_total{") && strings.Contains(k, `outcome="dropped"`) &&
					strings.Contains(k, `direction="`+dir+`"`) && strings.Contains(k, `service="`+svc+`"`) {
					_, reason, _ := strings.Cut(k, `reason="`)
					reason, _, _ = strings.Cut(reason, `"`)
					why = append(why, fmt.Sprintf("%s %.0f", reason, v))
				}
			}
			if len(why) > 0 {
				slices.Sort(why)
				part += " (" + strings.Join(why, ", ") + ")"
			}
			parts = append(parts, part)
		}
	}
	return rx, fw, fmt.Sprintf("%s (%s): %s", r.name, r.version, strings.Join(parts, ", "))
}

// finalIdentity is identity for a process that has exited, from its
// final counters (each balanced: finals checks), summed.
func finalIdentity(t *testing.T, name string, p *cidproxyProc) string {
	var rx, fw, dr uint64
	for _, c := range p.finals(t) {
		rx, fw, dr = rx+c.Received, fw+c.Forwarded, dr+c.Dropped
	}
	return fmt.Sprintf("%s %d = %d + %d", name, rx, fw, dr)
}

// dayCounters are what the clients saw, summed. Resent: pion records
// sent again after 400 ms without their echo (a datagram lost either
// way); Unanswered: messages that never got their echo (pion: the ask
// gave up; quic-go: not even after a new connection).
// Lost: pion records (or their echoes) that never came back, read with
// the clients parked.
type dayCounters struct {
	Messages, Resent, Unanswered, Lost, FailedSessions, Rehandshakes, Moves int64
}

func (a dayCounters) sub(b dayCounters) dayCounters {
	return dayCounters{a.Messages - b.Messages, a.Resent - b.Resent, a.Unanswered - b.Unanswered, a.Lost - b.Lost,
		a.FailedSessions - b.FailedSessions, a.Rehandshakes - b.Rehandshakes, a.Moves - b.Moves}
}

func add(a, b dayCounters) dayCounters {
	return dayCounters{a.Messages + b.Messages, a.Resent + b.Resent, a.Unanswered + b.Unanswered, a.Lost + b.Lost,
		a.FailedSessions + b.FailedSessions, a.Rehandshakes + b.Rehandshakes, a.Moves + b.Moves}
}

// A dayDTLS is one pion device: its sessions in turn (a cut one is
// replaced by a new handshake).
type dayDTLS struct {
	id   int
	d    *dayCluster
	mu   sync.Mutex
	cur  *soakClient
	past []*soakClient

	failedSessions, rehandshakes, onDraining, dialFailed atomic.Int64
}

// A dayQUIC is one quic-go device: a connection with one echo stream,
// migrating to a new socket every few messages; a connection the server
// closes is dialed again.
type dayQUIC struct {
	id   int
	d    *dayCluster
	mu   sync.Mutex
	sock *cidroutetest.RebindConn
	trs  []*quic.Transport
	conn *quic.Conn
	st   *quic.Stream

	messages, lost                                      atomic.Int64
	failedSessions, rehandshakes, migrations, migFailed atomic.Int64
	onDraining                                          atomic.Int64
}

// A dayGate parks every client between two steps, so that the step's
// figures are read with nothing in flight: a parked pion client has
// collected the echoes it was owed (or waited soakDrainWait for them).
type dayGate struct {
	mu              sync.Mutex
	cond            *sync.Cond
	running, parked int
	paused          bool
	resume          chan struct{}
}

func newGate() *dayGate {
	g := &dayGate{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *dayGate) enter() {
	g.mu.Lock()
	g.running++
	g.mu.Unlock()
}

func (g *dayGate) exit() {
	g.mu.Lock()
	g.running--
	g.cond.Broadcast()
	g.mu.Unlock()
}

// park is a client's check between two exchanges: while paused, it
// drains and waits for resume (or stop).
func (g *dayGate) park(drain func(), stop <-chan struct{}) {
	g.mu.Lock()
	if !g.paused {
		g.mu.Unlock()
		return
	}
	ch := g.resume
	g.mu.Unlock()
	drain()
	g.mu.Lock()
	g.parked++
	g.cond.Broadcast()
	g.mu.Unlock()
	select {
	case <-ch:
	case <-stop:
	}
	g.mu.Lock()
	g.parked--
	g.mu.Unlock()
}

// pause returns once every running client has parked.
func (g *dayGate) pause() {
	g.mu.Lock()
	g.paused, g.resume = true, make(chan struct{})
	for g.parked < g.running {
		g.cond.Wait()
	}
	g.mu.Unlock()
}

func (g *dayGate) resumeAll() {
	g.mu.Lock()
	g.paused = false
	close(g.resume)
	g.mu.Unlock()
}

// dayClients drives both populations until stop.
type dayClients struct {
	dtls []*dayDTLS
	quic []*dayQUIC
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func (d *dayCluster) dialDTLS(ctx context.Context, id int) (*soakClient, error) {
	var err error
	for try := range 3 {
		var c *soakClient
		// The handshake goes through one replica; then the balancer
		// hashes the socket's port like any other.
		via := d.pick(uint16(id*7+try), false)
		if c, err = soakDial(ctx, id, via, 5*time.Second); err == nil {
			d.retargetDTLS(c)
			c.tries, c.wait = 4, 400*time.Millisecond
			return c, nil
		}
	}
	return nil, err
}

func (d *dayCluster) retargetDTLS(c *soakClient) {
	c.sock.Retarget(d.pick(c.sock.Local().Port(), false))
}

func (d *dayCluster) newDTLS(ctx context.Context, id int) (*dayDTLS, error) {
	c, err := d.dialDTLS(ctx, id)
	if err != nil {
		return nil, err
	}
	return &dayDTLS{id: id, d: d, cur: c}, nil
}

func (d *dayCluster) newQUIC(ctx context.Context, id int) (*dayQUIC, error) {
	q := &dayQUIC{id: id, d: d}
	if err := q.dial(ctx); err != nil {
		return nil, err
	}
	return q, nil
}

func (q *dayQUIC) dial(ctx context.Context) error {
	sock, err := cidroutetest.ListenRebind(netip.AddrPort{}, net.UDPAddrFromAddrPort(soakQUICPublic))
	if err != nil {
		return err
	}
	sock.WatchQUICDCID(cidroute.DefaultQUICCIDLen)
	sock.Retarget(q.d.pick(sock.Local().Port(), true))
	tr := &quic.Transport{Conn: sock}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := tr.Dial(dctx, net.UDPAddrFromAddrPort(soakQUICPublic),
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicecho.DefaultALPN}}, &quic.Config{})
	if err == nil {
		var st *quic.Stream
		if st, err = conn.OpenStreamSync(dctx); err == nil {
			q.mu.Lock()
			q.sock, q.conn, q.st = sock, conn, st
			q.trs = append(q.trs, tr)
			q.mu.Unlock()
			return nil
		}
		conn.CloseWithError(0, "")
	}
	tr.Close()
	return fmt.Errorf("quic client %d: dial: %w", q.id, err)
}

// ordinal is the backend ordinal in the server CID the client uses now
// (QUIC-LB: byte 1), or -1.
func (q *dayQUIC) ordinal() int {
	q.mu.Lock()
	s := q.sock
	q.mu.Unlock()
	if cid := s.DCID(); len(cid) > 1 {
		return int(cid[1])
	}
	return -1
}

func (q *dayQUIC) target() netip.AddrPort {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.sock.Target()
}

func (q *dayQUIC) retarget() {
	q.mu.Lock()
	s := q.sock
	q.mu.Unlock()
	s.Retarget(q.d.pick(s.Local().Port(), true))
}

// echo is one exchange on the stream, within 3 s.
func (q *dayQUIC) echo(msg []byte) error {
	q.mu.Lock()
	st := q.st
	q.mu.Unlock()
	if _, err := st.Write(msg); err != nil {
		return err
	}
	st.SetReadDeadline(time.Now().Add(3 * time.Second))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(st, got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return fmt.Errorf("echo %q of %q", got, msg)
	}
	return nil
}

// migrate moves the connection to a new socket, which the balancer may
// send to another replica: quic-go probes the path, then switches.
func (q *dayQUIC) migrate(ctx context.Context) error {
	sock, err := cidroutetest.ListenRebind(netip.AddrPort{}, net.UDPAddrFromAddrPort(soakQUICPublic))
	if err != nil {
		return err
	}
	sock.WatchQUICDCID(cidroute.DefaultQUICCIDLen)
	sock.Retarget(q.d.pick(sock.Local().Port(), true))
	tr := &quic.Transport{Conn: sock}
	q.mu.Lock()
	conn := q.conn
	q.trs = append(q.trs, tr)
	q.mu.Unlock()
	path, err := conn.AddPath(tr)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := path.Probe(pctx); err != nil {
		return err
	}
	if err := path.Switch(); err != nil {
		return err
	}
	q.mu.Lock()
	q.sock = sock
	q.mu.Unlock()
	return nil
}

func (q *dayQUIC) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.conn != nil {
		q.conn.CloseWithError(0, "done")
	}
	for _, tr := range q.trs {
		tr.Close()
	}
}

// startClients handshakes n pion and m quic-go clients, a few at a time,
// and starts driving them.
func (d *dayCluster) startClients(ctx context.Context, first, n, m int) *dayClients {
	t := d.t
	cl := &dayClients{stop: make(chan struct{}), dtls: make([]*dayDTLS, n), quic: make([]*dayQUIC, m)}
	require.NoError(t, within(n, 4, func(i int) (err error) {
		cl.dtls[i], err = d.newDTLS(ctx, first+i)
		return err
	}))
	require.NoError(t, within(m, 4, func(i int) (err error) {
		cl.quic[i], err = d.newQUIC(ctx, first+i)
		return err
	}))
	g := d.gate
	for _, c := range cl.dtls {
		g.enter()
		cl.wg.Go(func() {
			defer g.exit()
			c.run(ctx, cl.stop)
		})
	}
	for _, q := range cl.quic {
		g.enter()
		cl.wg.Go(func() {
			defer g.exit()
			q.run(ctx, cl.stop)
		})
	}
	return cl
}

func (c *dayDTLS) client() *soakClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

func (c *dayDTLS) run(ctx context.Context, stop <-chan struct{}) {
	sc := c.d.sc
	for k := 1; ; k++ {
		select {
		case <-stop:
			return
		case <-time.After(sc.Pause):
		}
		c.d.gate.park(func() { c.client().drain() }, stop)
		cur := c.client()
		if k%sc.RebindEvery == 0 {
			if cur.sock.Rebind(cur.sock.Target()) == nil {
				c.d.retargetDTLS(cur)
			}
		}
		err := cur.ask()
		if err == nil {
			continue
		}
		c.d.failed("dtls %d (ordinal %d via %v): %v", c.id, cur.ordinal(), cur.sock.Target(), err)
		// The session is gone (its backend cut it at the end of a drain):
		// a new handshake, through whichever replica the balancer picks.
		c.failedSessions.Add(1)
		c.rehandshakes.Add(1)
		before := c.d.drainingSet()
		nc, err := c.d.dialDTLS(ctx, c.id)
		if err != nil {
			c.dialFailed.Add(1)
			return
		}
		c.mu.Lock()
		c.past = append(c.past, c.cur)
		c.cur = nc
		c.mu.Unlock()
		cur.close()
		if nc.ask() == nil && c.d.landedDraining(before, nc.ordinal(), fmt.Sprintf("dtls %d", c.id)) {
			c.onDraining.Add(1)
		}
	}
}

func (q *dayQUIC) run(ctx context.Context, stop <-chan struct{}) {
	sc := q.d.sc
	for k := 1; ; k++ {
		select {
		case <-stop:
			return
		case <-time.After(sc.Pause):
		}
		q.d.gate.park(func() {}, stop) // nothing owed between two exchanges
		if k%sc.MigrateEvery == 0 {
			if err := q.migrate(ctx); err != nil {
				q.migFailed.Add(1)
			} else {
				q.migrations.Add(1)
			}
		}
		msg := fmt.Appendf(nil, "q%d-m%d", q.id, k)
		q.messages.Add(1)
		err := q.echo(msg)
		if err == nil {
			continue
		}
		q.d.failed("quic %d (ordinal %d via %v): %v", q.id, q.ordinal(), q.target(), err)
		// A connection the server closed (drain deadline) or one that
		// stalled: dial again and send the message once more.
		q.failedSessions.Add(1)
		q.rehandshakes.Add(1)
		q.mu.Lock()
		old := q.conn
		q.mu.Unlock()
		old.CloseWithError(0, "")
		before := q.d.drainingSet()
		if err := q.dial(ctx); err != nil {
			q.lost.Add(1)
			return
		}
		if err := q.echo(msg); err != nil {
			q.lost.Add(1)
			continue
		}
		if q.d.landedDraining(before, q.ordinal(), fmt.Sprintf("quic %d", q.id)) {
			q.onDraining.Add(1)
		}
	}
}

// retarget re-applies the balancer to every client's current port (a
// replica died or joined).
func (cl *dayClients) retarget(d *dayCluster) {
	for _, c := range cl.dtls {
		d.retargetDTLS(c.client())
	}
	for _, q := range cl.quic {
		q.retarget()
	}
}

func (cl *dayClients) stopAll() {
	cl.once.Do(func() {
		close(cl.stop)
		cl.wg.Wait()
		var wg sync.WaitGroup
		for _, c := range cl.dtls {
			wg.Go(c.client().drain)
		}
		wg.Wait()
		for _, c := range cl.dtls {
			c.client().close()
		}
		for _, q := range cl.quic {
			q.close()
		}
	})
}

// lostDatagrams is what the pion clients sent and never got back, once
// they have stopped and drained: writes − echoes.
func (cl *dayClients) lostDatagrams() (n int64) {
	for _, c := range cl.dtls {
		c.mu.Lock()
		all := append(slices.Clone(c.past), c.cur)
		c.mu.Unlock()
		n += soakSum(all).Lost()
	}
	return n
}

// counters sums what the clients saw, per protocol.
func (cl *dayClients) counters() (dtlsC, quicC dayCounters) {
	for _, c := range cl.dtls {
		c.mu.Lock()
		all := append(slices.Clone(c.past), c.cur)
		c.mu.Unlock()
		t := soakSum(all)
		dtlsC.Messages += t.Asks
		dtlsC.Resent += t.Retries
		dtlsC.Unanswered += t.Failed
		dtlsC.Lost += t.Lost()
		dtlsC.Moves += t.Rebinds
		dtlsC.FailedSessions += c.failedSessions.Load()
		dtlsC.Rehandshakes += c.rehandshakes.Load()
	}
	for _, q := range cl.quic {
		quicC.Messages += q.messages.Load()
		quicC.Unanswered += q.lost.Load()
		quicC.Moves += q.migrations.Load()
		quicC.FailedSessions += q.failedSessions.Load()
		quicC.Rehandshakes += q.rehandshakes.Load()
	}
	return dtlsC, quicC
}

func (cl *dayClients) onDraining() (n int64) {
	for _, c := range cl.dtls {
		n += c.onDraining.Load()
	}
	for _, q := range cl.quic {
		n += q.onDraining.Load()
	}
	return n
}

// A dayRow is one step of the table.
type dayRow struct {
	Step       string
	Elapsed    time.Duration
	DTLS, QUIC dayCounters
	Bound      string
	Kernel     uint64   // datagrams the kernel dropped at the replicas' service sockets in the step
	Identity   []string // compact, for the table
	Detail     []string // per service and direction, for the log
	Notes      string
}

func TestSoakDayInTheLife(t *testing.T) {
	sc := dayScaleFor()
	bins := buildProxies(t)
	ctx := t.Context()
	d := newDay(t, sc, bins)
	begin := time.Now()
	cl := d.startClients(ctx, 0, sc.DTLS, sc.QUIC)
	defer cl.stopAll()
	var rows []dayRow
	var clients []*dayClients
	clients = append(clients, cl)
	// step runs one step: its action under traffic, then a phase of
	// traffic; the row holds the clients' deltas and the identities.
	var b0, q0 dayCounters // at the last pause
	var k0 uint64
	step := func(name, bound string, act func(row *dayRow)) {
		t.Helper()
		start := time.Now()
		row := dayRow{Step: name, Bound: bound}
		act(&row)
		soakSleep(t, sc.Step)
		d.gate.pause()
		defer d.gate.resumeAll()
		var b1, q1 dayCounters
		for _, c := range clients {
			bd, bq := c.counters()
			b1, q1 = add(b1, bd), add(q1, bq)
		}
		row.DTLS, row.QUIC, row.Elapsed = b1.sub(b0), q1.sub(q0), time.Since(start)
		k1 := d.kernelDrops()
		row.Kernel = k1 - k0
		b0, q0, k0 = b1, q1, k1
		for _, r := range d.liveReplicas() {
			rx, fw, detail := d.identity(r)
			row.Identity = append(row.Identity, fmt.Sprintf("%s %.0f = %.0f + %.0f", r.name, rx, fw, rx-fw))
			row.Detail = append(row.Detail, detail)
		}
		t.Logf("%s: dtls %+v, quic %+v; %s", name, row.DTLS, row.QUIC, strings.Join(row.Detail, "; "))
		d.mu.Lock()
		if len(d.failures) > 0 {
			t.Logf("%s: session failures:\n%s", name, strings.Join(d.failures, "\n"))
			d.failures = nil
		}
		d.mu.Unlock()
		rows = append(rows, row)
	}
	step("0. steady traffic", "0 (pion: ≤ 1 record per rebinding)", func(*dayRow) {})

	step("1. replica killed and restarted", "0 messages; the records in flight at the kill", func(row *dayRow) {
		a := d.replicas[0]
		require.NoError(t, a.cur().cmd.Process.Signal(syscall.SIGKILL))
		a.cur().waitExit(t, 5*time.Second)
		a.killed[len(a.killed)-1] = true
		d.setLive(a, false)
		cl.retarget(d) // the balancer notices
		soakSleep(t, sc.Step)
		d.writeConf(a)
		d.startProc(a, a.bin, a.version) // the same command; nothing to take over
		d.setLive(a, true)
		cl.retarget(d)
		row.Notes = "A's process SIGKILLed: its counters die with it; a new process on the same ports"
	})

	step("2. rolling restart of the backends", "≤ 1 message per session still open at the drain deadline (cut, then a new handshake)", func(row *dayRow) {
		cut := 0
		bd, bq := cl.counters()
		failed0 := bd.FailedSessions + bq.FailedSessions
		for k := 2; k >= 0; k-- {
			ord := uint8(k)
			d.setState(ord, registry.Draining)
			d.reload()
			d.mu.Lock()
			ds, qs := d.dtlsSrv[ord], d.quicSrv[ord]
			d.mu.Unlock()
			var wg sync.WaitGroup
			var dc, qc int
			dctx, cancel := context.WithTimeout(ctx, sc.Drain)
			wg.Go(func() { dc = ds.Drain(dctx) })
			wg.Go(func() { qc = qs.Drain(dctx) })
			wg.Wait()
			cancel()
			cut += dc + qc
			ds.Close()
			qs.Close()
			d.mu.Lock()
			d.oldDTLS, d.oldQUIC = append(d.oldDTLS, ds), append(d.oldQUIC, qs)
			d.mu.Unlock()
			d.setState(ord, registry.Gone)
			d.reload()
			d.startBackends(ord)
			d.reload()
		}
		// Every cut session is noticed within this step: its client's
		// next exchange fails at once, or after a migration's probe.
		waitUntil(t, 15*time.Second, "the clients noticing the cut sessions", func() bool {
			bd, bq := cl.counters()
			return bd.FailedSessions+bq.FailedSessions-failed0 >= int64(cut)
		})
		row.Notes = fmt.Sprintf("%d sessions cut at the drain deadline (%v), as the backends counted them", cut, sc.Drain)
	})

	step("3. proxy binary upgrade (handover)", "0", func(row *dayRow) {
		var ids []string
		for _, r := range d.liveReplicas() {
			old := r.cur()
			d.startProc(r, bins.v2, "e2e-v2")
			require.NoError(t, old.waitExit(t, 15*time.Second), "%s exits 0 after the handover", old.name)
			ids = append(ids, finalIdentity(t, old.name, old))
		}
		row.Notes = "each replica handed over to the e2e-v2 build, one after the other; the e2e-v1 processes' final counters: " + strings.Join(ids, "; ")
	})

	var late *dayClients
	step("4. config reload: a backend added, another draining", "0", func(row *dayRow) {
		d.startBackends(3)
		d.setState(0, registry.Draining)
		d.reload()
		late = d.startClients(ctx, 1000, 10, 10) // new sessions after the reload
		clients = append(clients, late)
		row.Notes = "ordinal 3 added (DTLS and QUIC), 0 draining; 10 pion and 10 quic-go clients join"
	})
	defer func() {
		if late != nil {
			late.stopAll()
		}
	}()

	step("5. scale-out to three replicas", "0", func(row *dayRow) {
		d.addReplica(bins.v2, "e2e-v2")
		cl.retarget(d)
		late.retarget(d)
		row.Notes = "C started; the balancer re-hashed every client (same source port) over A, B, C"
	})

	// The late clients' sessions, and every re-handshake, avoided the
	// draining backends.
	on := map[int]int{}
	for _, c := range late.dtls {
		on[c.client().ordinal()]++
		if c.client().ordinal() == 0 {
			t.Logf("dtls client %d on 0: %d sessions", c.id, len(c.past)+1)
		}
	}
	for _, q := range late.quic {
		on[q.ordinal()]++
		if q.ordinal() == 0 {
			t.Logf("quic client %d on 0: DCID %x, %d migrations, %d failed", q.id, q.sock.DCID(), q.migrations.Load(), q.migFailed.Load())
		}
	}
	assert.Zero(t, on[0], "a new session on the draining backend 0")
	assert.NotZero(t, on[3], "no new session on the added backend 3")
	rows[4].Notes += fmt.Sprintf("; their sessions by ordinal: %v", on)
	cl.stopAll()
	late.stopAll()
	assert.Zero(t, cl.onDraining()+late.onDraining(), "a re-handshake landed on a draining backend")
	// Every process still running stops cleanly with balanced counters.
	for _, r := range d.liveReplicas() {
		r.cur().stop(t)
		finalIdentity(t, r.cur().name, r.cur())
	}
	// The bounds. pion/dtls v3.1.15 can write the echo of the first
	// record after a rebinding to the old address (soakClient's resent):
	// at most one record per rebinding, in every step.
	for i, r := range rows {
		switch i {
		case 1: // the records in flight to the killed replica
			assert.Zero(t, r.DTLS.Unanswered+r.QUIC.Unanswered, "step 1: unanswered messages")
			assert.Zero(t, r.DTLS.FailedSessions+r.QUIC.FailedSessions, "step 1: failed sessions")
			assert.LessOrEqual(t, r.DTLS.Lost, int64(sc.DTLS)+r.DTLS.Moves, "step 1: lost records")
		case 2: // a cut session's message in flight goes unanswered
			assert.LessOrEqual(t, r.DTLS.Unanswered, r.DTLS.FailedSessions, "step 2: unanswered beyond the cut sessions")
			assert.Zero(t, r.QUIC.Unanswered, "step 2: QUIC messages unanswered after a new connection")
			assert.LessOrEqual(t, r.DTLS.Lost, r.DTLS.FailedSessions+r.DTLS.Moves, "step 2: lost records")
		default:
			assert.Zero(t, r.DTLS.Unanswered+r.QUIC.Unanswered, "%s: unanswered messages", r.Step)
			assert.Zero(t, r.DTLS.FailedSessions+r.QUIC.FailedSessions, "%s: failed sessions", r.Step)
			assert.LessOrEqual(t, r.DTLS.Lost, r.DTLS.Moves, "%s: lost records", r.Step)
		}
	}
	for _, r := range rows {
		assert.Zero(t, r.Kernel, "%s: datagrams dropped by the kernel at the replicas' service sockets", r.Step)
	}
	lost := cl.lostDatagrams() + late.lostDatagrams()
	t.Logf("pion records never echoed over the day: %d", lost)
	tbl := dayTable(sc, rows, time.Since(begin), lost)
	t.Log("\n" + tbl)
	if *soakFor > 0 {
		fmt.Print(tbl)
	}
}

func dayTable(sc dayScale, rows []dayRow, total time.Duration, lost int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "day in the life: %d pion and %d quic-go clients (a new port every %d messages, a new path every %d), %v between messages, steps of %v plus the change, drain deadline %v, %.0f s in all\n\n",
		sc.DTLS, sc.QUIC, sc.RebindEvery, sc.MigrateEvery, sc.Pause, sc.Step, sc.Drain, total.Seconds())
	b.WriteString("| step | time | messages DTLS / QUIC | unanswered DTLS / QUIC | DTLS records resent / lost | bound | kernel drops at the replicas | failed sessions | re-handshakes | rebinds / migrations | each replica's process: received = forwarded + dropped (both services and directions) |\n")
	b.WriteString("|---|--:|--:|--:|--:|---|--:|--:|--:|--:|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %.1f s | %d / %d | %d / %d | %d / %d | %s | %d | %d | %d | %d / %d | %s |\n",
			r.Step, r.Elapsed.Seconds(), r.DTLS.Messages, r.QUIC.Messages, r.DTLS.Unanswered, r.QUIC.Unanswered, r.DTLS.Resent, r.DTLS.Lost, r.Bound,
			r.Kernel, r.DTLS.FailedSessions+r.QUIC.FailedSessions, r.DTLS.Rehandshakes+r.QUIC.Rehandshakes,
			r.DTLS.Moves, r.QUIC.Moves, strings.Join(r.Identity, "; "))
	}
	for _, r := range rows {
		if r.Notes != "" {
			fmt.Fprintf(&b, "\n- %s: %s", r.Step, r.Notes)
		}
	}
	fmt.Fprintf(&b, "\n- pion records never echoed over the whole day: %d\n", lost)
	return b.String()
}
