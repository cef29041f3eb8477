package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// traffic is a set of DTLS sessions through a proxy, each echoing a
// record every 200 ms, plus a new handshake every newEvery: what a fleet
// of clients does while the test changes the cluster under it.
type traffic struct {
	p    *cidproxy
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	echoes  []echoAt // successful echoes
	lost    int      // echoes unanswered after 3 tries
	losses  []string // when, which session, which backend
	broken  int      // sessions given up after 3 lost echoes in a row
	cuts    int      // sessions closed by their backend and dialled again
	news    []newAt  // new handshakes (with one echo) and their outcome
	redials []string // errors of re-handshakes after a cut
}

type echoAt struct {
	at      time.Time
	session int
	ordinal int
}

type newAt struct {
	at    time.Time
	err   error
	round cookieRound
}

func (n newAt) String() string { return fmt.Sprintf("%s: %v", n.at.Format("15:04:05.000"), n.err) }

const echoEvery = 200 * time.Millisecond

// runTraffic opens n sessions through p (all must handshake) and keeps
// them busy until halt.
func runTraffic(t *testing.T, p *cidproxy, n int, newEvery time.Duration) *traffic {
	t.Helper()
	tr := &traffic{p: p, stop: make(chan struct{})}
	ss := make([]*session, n)
	for i := range ss {
		s, err := dial(context.Background(), p.addr, 10*time.Second)
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		ss[i] = s
	}
	for i, s := range ss {
		tr.wg.Go(func() { tr.session(i, s) })
	}
	if newEvery > 0 {
		tr.wg.Go(func() { tr.newSessions(newEvery) })
	}
	t.Cleanup(tr.halt)
	return tr
}

func (tr *traffic) stopped() bool {
	select {
	case <-tr.stop:
		return true
	default:
		return false
	}
}

// session echoes on s until halt; a session its backend closes (the end
// of a drain) is dialled again, as a client would.
func (tr *traffic) session(i int, s *session) {
	defer func() {
		if s != nil {
			s.close()
		}
	}()
	lostInARow := 0
	for seq := 0; !tr.stopped(); seq++ {
		err := s.echo(fmt.Sprintf("session %d record %d", i, seq), 3, 300*time.Millisecond)
		redial := false
		tr.mu.Lock()
		switch {
		case err == nil:
			lostInARow = 0
			// The session's CID names its backend; the client has
			// sent it in a tls12_cid record by now.
			tr.echoes = append(tr.echoes, echoAt{time.Now(), i, s.ordinal()})
		case errors.Is(err, errNoEcho):
			tr.lost++
			tr.losses = append(tr.losses, fmt.Sprintf("%s session %d on ordinal %d", time.Now().Format("15:04:05.000"), i, s.ordinal()))
			if lostInARow++; lostInARow == 3 {
				tr.broken++
				redial = true
			}
		default: // closed: the backend's close_notify at the end of its drain
			tr.cuts++
			redial = true
		}
		tr.mu.Unlock()
		if redial {
			lostInARow = 0
			s.close()
			s = nil
			for try := 0; s == nil && !tr.stopped(); try++ {
				ns, err := dial(context.Background(), tr.p.addr, 3*time.Second)
				if err != nil {
					tr.mu.Lock()
					tr.redials = append(tr.redials, fmt.Sprintf("session %d try %d: %v", i, try, err))
					tr.mu.Unlock()
					continue
				}
				s = ns
			}
			if s == nil {
				return
			}
		}
		select {
		case <-tr.stop:
		case <-time.After(echoEvery):
		}
	}
}

// newSessions handshakes a new session every every, echoes once, closes.
func (tr *traffic) newSessions(every time.Duration) {
	for !tr.stopped() {
		at := time.Now()
		s, round, err := dialRound(context.Background(), tr.p.addr, 2*time.Second)
		if err == nil {
			err = s.echo("new", 2, 500*time.Millisecond)
			s.close()
		}
		tr.mu.Lock()
		tr.news = append(tr.news, newAt{at, err, round})
		tr.mu.Unlock()
		select {
		case <-tr.stop:
		case <-time.After(time.Until(at.Add(every))):
		}
	}
}

// halt stops the traffic and waits for it; idempotent.
func (tr *traffic) halt() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	tr.wg.Wait()
}

// newOutcomes counts the new handshakes started in [from, to) that
// worked, and returns those that failed.
func (tr *traffic) newOutcomes(from, to time.Time) (ok int, failed []newAt) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, n := range tr.news {
		if n.at.Before(from) || !n.at.Before(to) {
			continue
		}
		if n.err == nil {
			ok++
		} else {
			failed = append(failed, n)
		}
	}
	return ok, failed
}

// echoesIn counts the successful echoes in [from, to), per session;
// ordinal -1 counts every backend.
func (tr *traffic) echoesIn(from, to time.Time, ordinal int) map[int]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	m := map[int]int{}
	for _, e := range tr.echoes {
		if !e.at.Before(from) && e.at.Before(to) && (ordinal < 0 || e.ordinal == ordinal) {
			m[e.session]++
		}
	}
	return m
}

// sessionsOn returns the sessions whose last echo before at went to
// ordinal.
func (tr *traffic) sessionsOn(at time.Time, ordinal int) []int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	last := map[int]int{}
	for _, e := range tr.echoes {
		if e.at.Before(at) {
			last[e.session] = e.ordinal
		}
	}
	var out []int
	for s, o := range last {
		if o == ordinal {
			out = append(out, s)
		}
	}
	return out
}

func (tr *traffic) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	ok := 0
	for _, n := range tr.news {
		if n.err == nil {
			ok++
		}
	}
	return fmt.Sprintf("%d echoes, %d lost, %d sessions broken, %d closed by their backend and dialled again, new handshakes %d ok of %d",
		len(tr.echoes), tr.lost, tr.broken, tr.cuts, ok, len(tr.news))
}
