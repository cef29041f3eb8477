package backend

import (
	"net/netip"
	"sync"
)

// routeTable holds the committed return routes: each route is reachable by
// its client address and, once the session's CID is known, by the CID.
// Every route has exactly one client key, so len(byClient) is the number
// of routes.
type routeTable struct {
	mu        sync.Mutex
	max       int
	idle      int64
	byClient  map[netip.AddrPort]*route
	byCID     map[string]*route
	lastSweep int64
	evicted   uint64
	expired   uint64
}

type route struct {
	addr Addr
	cid  string
	last int64 // clock reading of the last commit
}

func (t *routeTable) init(max int, idle int64) {
	t.max, t.idle = max, idle
	t.byClient = make(map[netip.AddrPort]*route)
	t.byCID = make(map[string]*route)
}

// commit points the route of a.Client, and of cid when given, at a.
func (t *routeTable) commit(a Addr, cid []byte, now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var r *route
	if len(cid) > 0 {
		r = t.byCID[string(cid)]
	}
	if r == nil {
		r = t.byClient[a.Client]
		if r != nil && len(cid) > 0 && r.cid != "" {
			// The address now belongs to another session (the CIDs
			// differ, or the lookup above would have found r).
			t.remove(r)
			r = nil
		}
	}
	if r == nil {
		t.makeRoom(now)
		r = &route{addr: a}
		t.byClient[a.Client] = r
	}
	if len(cid) > 0 && r.cid == "" {
		r.cid = string(cid)
		t.byCID[r.cid] = r
	}
	if r.addr.Client != a.Client {
		// The session moved to a new client address.
		if t.byClient[r.addr.Client] == r {
			delete(t.byClient, r.addr.Client)
		}
		if other := t.byClient[a.Client]; other != nil && other != r {
			t.remove(other)
		}
		t.byClient[a.Client] = r
	}
	r.addr, r.last = a, now
}

func (t *routeTable) lookupClient(client netip.AddrPort, now int64) (Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live(t.byClient[client], now)
}

func (t *routeTable) lookupCID(cid []byte, now int64) (Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live(t.byCID[string(cid)], now)
}

// live returns r's address unless r is nil or expired (then removed).
func (t *routeTable) live(r *route, now int64) (Addr, bool) {
	if r == nil {
		return Addr{}, false
	}
	if now-r.last > t.idle {
		t.remove(r)
		t.expired++
		return Addr{}, false
	}
	return r.addr, true
}

func (t *routeTable) forget(client netip.AddrPort, cid []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.byClient[client]; r != nil {
		t.remove(r)
	}
	if len(cid) > 0 {
		if r := t.byCID[string(cid)]; r != nil {
			t.remove(r)
		}
	}
}

func (t *routeTable) remove(r *route) {
	if t.byClient[r.addr.Client] == r {
		delete(t.byClient, r.addr.Client)
	}
	if r.cid != "" && t.byCID[r.cid] == r {
		delete(t.byCID, r.cid)
	}
}

// makeRoom keeps the table under max before an insert: it sweeps expired
// routes (at most once per idle/8, so a full table of live routes does not
// cost a sweep per insert), then evicts an arbitrary route.
func (t *routeTable) makeRoom(now int64) {
	if len(t.byClient) < t.max {
		return
	}
	if now-t.lastSweep >= t.idle/8 {
		t.lastSweep = now
		for _, r := range t.byClient {
			if now-r.last > t.idle {
				t.remove(r)
				t.expired++
			}
		}
	}
	for _, r := range t.byClient {
		if len(t.byClient) < t.max {
			break
		}
		t.remove(r)
		t.evicted++
	}
}

func (t *routeTable) stats() (n int, evicted, expired uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byClient), t.evicted, t.expired
}
