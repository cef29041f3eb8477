package e2e

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/edge"
	"github.com/cidroute/cidroute/internal/fakeclock"
)

const ms = time.Millisecond

// An edgeWatch drives a Chooser's watch rounds with a fake clock and
// keeps its events, stamped with the wall clock.
type edgeWatch struct {
	clk    *fakeclock.Clock
	cycles chan *edge.Switch
	mu     sync.Mutex
	events []edge.Event
	wall   []time.Time
}

func newEdgeWatch() *edgeWatch {
	return &edgeWatch{clk: fakeclock.New(time.Now()), cycles: make(chan *edge.Switch, 64)}
}

func (w *edgeWatch) on(e edge.Event) {
	w.mu.Lock()
	w.events = append(w.events, e)
	w.wall = append(w.wall, time.Now())
	w.mu.Unlock()
	if e.Kind == edge.EventCycle {
		w.cycles <- e.Switch
	}
}

// config returns an edge.Config resolving to addrs, in that order.
func (w *edgeWatch) config(addrs []netip.AddrPort) edge.Config {
	return edge.Config{Resolve: edge.Static(addrs...), Clock: w.clk, OnEvent: w.on, Logger: quiet(), ProbeTimeout: 2 * time.Second}
}

// round lets the session's next watch round run and returns its switch.
func (w *edgeWatch) round(t *testing.T) *edge.Switch {
	t.Helper()
	w.clk.Fire()
	select {
	case sw := <-w.cycles:
		return sw
	case <-time.After(30 * time.Second):
		t.Fatal("no watch round")
		return nil
	}
}

// switchWithin lets up to n more watch rounds run and returns the first
// switch, nil if none came: a streak of rounds can take longer than its
// length when a loaded machine's scheduling delay rides on a probe's RTT.
func (w *edgeWatch) switchWithin(t *testing.T, n int) *edge.Switch {
	t.Helper()
	for range n {
		if sw := w.round(t); sw != nil {
			return sw
		}
	}
	return nil
}

// mark returns the number of events so far.
func (w *edgeWatch) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.events)
}

// since returns the events of kind k after mark m, and their wall times.
func (w *edgeWatch) since(m int, k edge.EventKind) ([]edge.Event, []time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var evs []edge.Event
	var at []time.Time
	for i, e := range w.events[m:] {
		if e.Kind == k {
			evs = append(evs, e)
			at = append(at, w.wall[m+i])
		}
	}
	return evs, at
}

// probed returns the round-trip times the probes after mark m measured,
// by edge name (failed probes are absent).
func (l *edgeLab) probed(w *edgeWatch, m int) map[string]time.Duration {
	evs, _ := w.since(m, edge.EventProbe)
	out := map[string]time.Duration{}
	for _, e := range evs {
		if e.Err == nil {
			out[l.edgeOf(e.Addr)] = e.Sample.RTT
		}
	}
	return out
}

// pionDialer is a pion/dtls v3 edge dialer with the service's PSK,
// resolving to the named edges in that order.
func (l *edgeLab) pionDialer(t *testing.T, w *edgeWatch, cfg piondtls.EdgeConfig, names ...string) *piondtls.EdgeDialer {
	t.Helper()
	cfg.DTLS = dtlsecho.PSKClientConfig(testPSK, "edge")
	ec := w.config(l.dtlsAddrs(names...))
	ec.Store = cfg.Edge.Store
	if cfg.Edge.ProbeTimeout != 0 {
		ec.ProbeTimeout = cfg.Edge.ProbeTimeout
	}
	cfg.Edge = ec
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 5 * time.Second
	}
	d, err := piondtls.NewEdgeDialer(cfg)
	require.NoError(t, err)
	return d
}

// ranked logs and returns the ranking's order by edge name.
func (l *edgeLab) ranked(t *testing.T, r *edge.Ranking) []string {
	t.Helper()
	var names []string
	for _, e := range r.Entries {
		names = append(names, l.edgeOf(e.Addr))
		t.Logf("  edge %s %v: ok=%v rtt=%v handshake=%v %s", l.edgeOf(e.Addr), e.Addr, e.OK, e.Sample.RTT, e.Sample.Handshake, e.Err)
	}
	return names
}

// TestEdgePionHysteresis: three edges at 5, 30 and 80 ms. The client picks
// the 5 ms edge; when that link goes to 60 ms it moves only after two
// rounds in a row show the 30 ms edge better by ≥ 20 ms and ≥ 25 %; a
// 10 ms wobble between two edges never moves it; when the first edge is
// fast again it fails back, after two rounds. Each move is a retarget:
// the DTLS session goes on, answered by the same backend, and the only
// handshakes the backends see are the probes'.
func TestEdgePionHysteresis(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newEdgeLab(t, 5*ms, 30*ms, 80*ms)
	w := newEdgeWatch()
	d := l.pionDialer(t, w, piondtls.EdgeConfig{Silence: -1}, "C", "B", "A")
	c, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer c.Close()
	t.Log("ranking at dial:")
	require.Equal(t, []string{"A", "B", "C"}, l.ranked(t, d.Chooser().Ranking()), "nearest first, whatever the resolver's order")
	require.Equal(t, "A", l.edgeOf(c.Edge()))
	reply, err := ask(c, "hello", 5, time.Second)
	require.NoError(t, err)
	owner := answeredBy(t, reply, "hello")
	hs := l.dtlsHandshakes()

	// A's link goes to 60 ms.
	l.edge("A").link.setRTT(60 * ms)
	m := w.mark()
	require.Nil(t, w.round(t), "one round is not enough")
	r1 := l.probed(w, m)
	t.Logf("round 1 (a full measurement: the ranking was MaxAge old): %v", r1)
	require.Len(t, r1, 3)
	assert.Equal(t, "A", l.edgeOf(c.Edge()))
	m = w.mark()
	sw := w.round(t)
	r2 := l.probed(w, m)
	t.Logf("round 2 (the current edge and those ranked above it): %v", r2)
	require.NotNil(t, sw, "the second round in a row moves it")
	assert.Equal(t, "B", l.edgeOf(sw.To))
	assert.Equal(t, edge.Better, sw.Reason)
	for i, r := range []map[string]time.Duration{r1, r2} {
		gain := r["A"] - r["B"]
		assert.True(t, gain >= 20*ms && gain*4 >= r["A"], "round %d: B better by %v of %v", i+1, gain, r["A"])
	}
	assert.Len(t, r2, 2, "C, below A, is not probed")
	// The round reports the switch as the session begins it.
	require.Eventually(t, func() bool { return l.edgeOf(c.Edge()) == "B" }, 5*time.Second, 5*time.Millisecond,
		"the session moved to B")
	for k := range 3 {
		msg := fmt.Sprint("via B ", k)
		reply, err := ask(c, msg, 3, time.Second)
		require.NoError(t, err)
		require.Equal(t, owner, answeredBy(t, reply, msg), "the same backend")
	}
	probes := func(from int) uint64 {
		evs, _ := w.since(from, edge.EventProbe)
		n := uint64(0)
		for _, e := range evs {
			if e.Err == nil {
				n++
			}
		}
		return n
	}
	assert.Equal(t, hs+probes(0)-3, l.dtlsHandshakes(), "no handshake but the probes' (3 at dial)")

	// A 10 ms wobble: A at 40 ms, B between 40 and 50 ms. Never moves.
	l.edge("A").link.setRTT(40 * ms)
	for i, b := range []time.Duration{50 * ms, 40 * ms, 50 * ms, 40 * ms, 50 * ms} {
		l.edge("B").link.setRTT(b)
		m := w.mark()
		require.Nil(t, w.round(t), "wobble round %d", i+1)
		t.Logf("wobble round %d: %v", i+1, l.probed(w, m))
		require.Equal(t, "B", l.edgeOf(c.Edge()))
	}

	// A is near again: back after two rounds (or another pair, when a
	// loaded machine's scheduling delay rides on a probe's RTT).
	l.edge("A").link.setRTT(5 * ms)
	require.Nil(t, w.round(t))
	sw = w.switchWithin(t, 5)
	require.NotNil(t, sw)
	assert.Equal(t, edge.Switch{From: l.edge("B").dtlsAddr, To: l.edge("A").dtlsAddr, Reason: edge.Better, FromRTT: sw.FromRTT, ToRTT: sw.ToRTT}, *sw)
	t.Logf("failback: B %v -> A %v", sw.FromRTT, sw.ToRTT)
	require.Eventually(t, func() bool { return l.edgeOf(c.Edge()) == "A" }, 5*time.Second, 5*time.Millisecond,
		"the session moved back to A")
	reply, err = ask(c, "home", 3, time.Second)
	require.NoError(t, err)
	require.Equal(t, owner, answeredBy(t, reply, "home"))
	assert.Equal(t, hs+probes(0)-3, l.dtlsHandshakes())
	st := d.Chooser().Stats()
	assert.Equal(t, uint64(2), st.Switches[edge.Better])
	assert.Equal(t, uint64(2), st.SwitchesTotal())

	// The backend saw one session, moved from edge to edge.
	var mine *dtlsecho.Session
	for _, s := range l.dtls[owner].Sessions() {
		if s.Messages > 1 {
			mine = &s
		}
	}
	require.NotNil(t, mine)
	assert.Equal(t, 2, mine.Moves, "A → B → A")
	assert.True(t, mine.Open)
}

// TestEdgePionSessionOutlivesItsEdge: the switch without a handshake. A
// DTLS session through edge A goes silent there and moves to B while an
// answer is still on its way through A, and reads it; then B dies under a
// steady stream of messages: the silence detector moves the session back
// to A, and it goes on. The backends see no new handshake, and the only messages lost
// are those sent while B was dead and the session had not left it yet.
func TestEdgePionSessionOutlivesItsEdge(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newEdgeLab(t, 5*ms, 30*ms)
	w := newEdgeWatch()
	// Long enough that a reply through B delayed by a loaded machine (and
	// -race) is not taken for B's death; short against A's slow 2 s.
	const silence = 600 * ms
	d := l.pionDialer(t, w, piondtls.EdgeConfig{Silence: silence}, "A", "B")
	c, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "A", l.edgeOf(c.Edge()))
	reply, err := ask(c, "hello", 5, time.Second)
	require.NoError(t, err)
	owner := answeredBy(t, reply, "hello")
	hs := l.dtlsHandshakes()

	// A gets slow: 1 s each way. A message goes out through it and,
	// 600 ms without an answer later, the silence detector moves the
	// session to B, before the message even reaches the backend. The
	// backend answers through A, where the message came from; the answer
	// is read all the same. The next message goes through B.
	l.edge("A").link.setRTT(2 * time.Second)
	m0 := w.mark()
	_, err = c.Write([]byte("slow"))
	require.NoError(t, err)
	buf := make([]byte, 2048)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := c.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%d|slow", owner), string(buf[:n]), "the answer in flight through A")
	sws, _ := w.since(m0, edge.EventSwitch)
	require.Len(t, sws, 1, "the session had left A when the answer came")
	assert.Equal(t, "B", l.edgeOf(sws[0].Switch.To))
	assert.Equal(t, edge.Unreachable, sws[0].Switch.Reason)
	reply, err = ask(c, "fast", 3, time.Second)
	require.NoError(t, err)
	assert.Equal(t, owner, answeredBy(t, reply, "fast"))
	l.edge("A").link.setRTT(5 * ms)
	require.Equal(t, "B", l.edgeOf(c.Edge()), "on B when the stream starts")
	require.Equal(t, uint64(1), c.Stats().Silences, "one silence so far: A's")

	// A stream of messages; B dies in the middle of it.
	type sent struct {
		at     time.Time
		answer bool
	}
	var mu sync.Mutex
	msgs := map[string]*sent{}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		buf := make([]byte, 2048)
		for {
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, err := c.Read(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				select {
				case <-stop:
					return
				default:
					continue
				}
			}
			if err != nil {
				return
			}
			_, msg, _ := strings.Cut(string(buf[:n]), "|")
			mu.Lock()
			if s := msgs[msg]; s != nil {
				s.answer = true
			}
			mu.Unlock()
		}
	}()
	m := w.mark()
	send := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * ms) {
			mu.Lock()
			msg := fmt.Sprint("m", len(msgs))
			msgs[msg] = &sent{at: time.Now()}
			mu.Unlock()
			_, err := c.Write([]byte(msg))
			require.NoError(t, err)
		}
	}
	send(500 * ms)
	killed := time.Now()
	l.edge("B").stop(t)
	send(1500 * ms)
	time.Sleep(500 * ms) // the last answers
	close(stop)
	readers.Wait()

	sws, at := w.since(m, edge.EventSwitch)
	require.Len(t, sws, 1)
	assert.Equal(t, edge.Switch{From: l.edge("B").dtlsAddr, To: l.edge("A").dtlsAddr, Reason: edge.Unreachable, ToRTT: sws[0].Switch.ToRTT}, *sws[0].Switch)
	moved := at[0]
	t.Logf("B killed; the session left it %v later (silence %v)", moved.Sub(killed).Round(ms), silence)
	var lost []string
	for msg, s := range msgs {
		if s.answer {
			continue
		}
		lost = append(lost, msg)
		// In flight: sent at most one round trip before B died, and before
		// the session left B.
		assert.True(t, s.at.After(killed.Add(-30*ms)) && s.at.Before(moved),
			"%s, lost, was sent %v after B died, and the session left B %v after: not in flight", msg, s.at.Sub(killed), moved.Sub(killed))
	}
	t.Logf("%d messages, %d lost, all sent between B's death and the failover", len(msgs), len(lost))
	assert.NotEmpty(t, lost, "the edge really died")
	assert.Equal(t, hs, l.dtlsHandshakes(), "zero new handshakes at the backends")
	assert.Equal(t, uint64(2), c.Stats().Silences, "A too slow, then B dead")

	var mine []dtlsecho.Session
	for _, s := range l.dtls[owner].Sessions() {
		if s.Open {
			mine = append(mine, s)
		}
	}
	require.Len(t, mine, 1, "one session")
	assert.Equal(t, 2, mine[0].Moves, "A → B → A")
}

// TestEdgePionOneCandidate: with a single edge address the client never
// probes: the backends see one handshake, the session's own.
func TestEdgePionOneCandidate(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newEdgeLab(t, 30*ms)
	w := newEdgeWatch()
	d := l.pionDialer(t, w, piondtls.EdgeConfig{})
	c, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer c.Close()
	for range 3 {
		require.Nil(t, w.round(t))
	}
	_, err = ask(c, "hi", 3, time.Second)
	require.NoError(t, err)
	st := d.Chooser().Stats()
	assert.Zero(t, st.Probes)
	assert.Equal(t, uint64(4), st.Skipped, "the dial and three rounds")
	assert.Equal(t, uint64(1), l.dtlsHandshakes())
}

// TestEdgePionAllUnreachable: every edge's link is down. The probes all
// fail, so the dial tries the edges in the resolver's order (and fails:
// an error for the caller's backoff). One edge comes back: the next dial
// finds it. A better one comes back later: the failed edges are watched,
// and the session fails back after two rounds.
func TestEdgePionAllUnreachable(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newEdgeLab(t, 5*ms, 30*ms, 80*ms)
	for _, e := range l.edges {
		e.link.setDown(true)
	}
	w := newEdgeWatch()
	d := l.pionDialer(t, w, piondtls.EdgeConfig{HandshakeTimeout: 500 * ms, Silence: -1,
		Edge: edge.Config{ProbeTimeout: time.Second}}, "C", "A", "B")
	_, err := d.Dial(t.Context())
	require.Error(t, err)
	msg := err.Error()
	ic, ia, ib := strings.Index(msg, l.edge("C").dtlsAddr.String()), strings.Index(msg, l.edge("A").dtlsAddr.String()), strings.Index(msg, l.edge("B").dtlsAddr.String())
	assert.True(t, 0 <= ic && ic < ia && ia < ib, "tried in the resolver's order C, A, B: %v", err)
	fb, _ := w.since(0, edge.EventFallback)
	require.Len(t, fb, 1)

	l.edge("B").link.setDown(false)
	c, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "B", l.edgeOf(c.Edge()))
	t.Log("ranking with B back:")
	require.Equal(t, []string{"B", "C", "A"}, l.ranked(t, d.Chooser().Ranking()), "B, then the failed ones in the resolver's order")
	_, err = ask(c, "back", 3, time.Second)
	require.NoError(t, err)

	l.edge("A").link.setDown(false)
	m := w.mark()
	require.Nil(t, w.round(t), "one round never switches")
	assert.Contains(t, l.probed(w, m), "A", "a failed edge is watched")
	// The second round switches when both of A's probes beat B by the
	// margin; on a loaded machine a probe's RTT can carry scheduling
	// delay, so the rule may want another pair of rounds.
	var sw *edge.Switch
	for r := 2; sw == nil && r <= 6; r++ {
		sw = w.round(t)
		t.Logf("round %d: switch %v, probes %v", r, sw, l.probed(w, m))
	}
	require.NotNil(t, sw, "A back, 25 ms nearer than B: the session fails back")
	assert.Equal(t, "A", l.edgeOf(sw.To))
	_, err = ask(c, "home", 3, time.Second)
	require.NoError(t, err)
}

// TestEdgePionRankingSurvivesRestart: the ranking is stored with its
// address set. A restarted client dials the best edge without probing; a
// client whose name resolves to a changed set measures again.
func TestEdgePionRankingSurvivesRestart(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newEdgeLab(t, 5*ms, 30*ms, 80*ms)
	path := t.TempDir() + "/edges.json"
	dial := func(names ...string) (*piondtls.EdgeDialer, string) {
		w := newEdgeWatch()
		d := l.pionDialer(t, w, piondtls.EdgeConfig{Edge: edge.Config{Store: edge.FileStore(path)}}, names...)
		c, err := d.Dial(t.Context())
		require.NoError(t, err)
		_, err = ask(c, "hi", 3, time.Second)
		require.NoError(t, err)
		defer c.Close()
		return d, l.edgeOf(c.Edge())
	}
	hs := l.dtlsHandshakes()
	d, at := dial("C", "B", "A")
	assert.Equal(t, "A", at)
	assert.Equal(t, uint64(3), d.Chooser().Stats().Probes)
	assert.Equal(t, hs+4, l.dtlsHandshakes(), "three probes and the session")

	// A restart: the stored ranking, no probe.
	d, at = dial("A", "C", "B")
	assert.Equal(t, "A", at)
	assert.Zero(t, d.Chooser().Stats().Probes)
	assert.Equal(t, hs+5, l.dtlsHandshakes(), "only the session")

	// The name now resolves to B and C: another set, measured anew.
	d, at = dial("C", "B")
	assert.Equal(t, "B", at)
	assert.Equal(t, uint64(2), d.Chooser().Stats().Probes)
	assert.Equal(t, uint64(1), d.Chooser().Stats().Discarded)
}
