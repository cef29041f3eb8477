package cidroute

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Original-source mode (Service.OriginalSource) is transparent mode with
// another session socket: instead of an ephemeral port of the proxy, each
// session's socket is bound to the client's own address and port
// (IP_TRANSPARENT, which needs CAP_NET_ADMIN or CAP_NET_RAW) and
// connected to the backend, so an unmodified server sees the device's address. The
// session table, its limits, idle expiry, eviction and counters, the
// reverse rule and the relay from the service's address are transparent
// mode's. A client that rebinds is a new flow, so its new address gets a
// socket of its own and the backend sees the new address.
//
// The backend's replies are addressed to the client, so the network must
// bring them back to the proxy (the backend's route to its clients goes
// through it) and the proxy's kernel must deliver them locally, to the
// session's socket, instead of forwarding them: a policy rule for the
// datagrams arriving from the backends and a local default route in its
// table (docs/original-source.md). The socket is connected, so the
// kernel's socket lookup matches the reply's 4-tuple: no TPROXY rule is
// needed.
//
// New checks both at start-up: the capability with a probe socket, and,
// for each backend the registry holds then, that the kernel would deliver
// a datagram from it to a client address (originalSourceProbe4 or 6)
// locally. A backend that appears later is checked at its first session;
// while its check fails, datagrams of new sessions to it are dropped as
// SendError and the failure is logged.

// ErrOriginalSource is wrapped by the errors of original-source mode's
// checks: a capability or a return route that is missing.
var ErrOriginalSource = errors.New("cidroute: original-source forwarding unavailable")

// The client addresses the return-route check asks the kernel about: the
// documentation prefixes, which no client uses, so a rule that covers
// every destination (as docs/original-source.md's does) covers them.
var (
	originalSourceProbe4 = netip.MustParseAddrPort("192.0.2.1:40000")
	originalSourceProbe6 = netip.MustParseAddrPort("[2001:db8::1]:40000")
)

// routeRecheck is how long a failed return-route check is trusted before
// a new session to that backend checks again.
const routeRecheck = time.Second

// origSrc is a service's original-source state: the return-route checks
// of its backends, shared by its workers' session tables.
type origSrc struct {
	service string
	log     *slog.Logger
	mu      sync.Mutex
	checked map[netip.Addr]routeCheck
}

type routeCheck struct {
	at  time.Time
	err error
}

// newOrigSrc checks what original-source mode needs for service sc with
// backends: the capability, and the return route of every backend the
// registry holds now.
func newOrigSrc(sc Service, backends Backends, log *slog.Logger) (*origSrc, error) {
	six := sc.Listen.Addr().Is6()
	if err := probeTransparent(six); err != nil {
		return nil, err
	}
	o := &origSrc{service: sc.Name, log: log.With("service", sc.Name), checked: map[netip.Addr]routeCheck{}}
	bs := backends.Snapshot().Backends()
	if len(bs) == 0 {
		o.log.Warn("original source: no backends to check the return route of yet; each is checked at its first session")
	}
	now := time.Now()
	for _, b := range bs {
		a := b.Addr.Addr().Unmap()
		if a.Is6() != six {
			return nil, fmt.Errorf("original source: backend %d at %v is of the other address family than the listen address %v, and a client's address cannot be the source of a datagram to it: %w",
				b.Ordinal, b.Addr, sc.Listen, ErrConfig)
		}
		if err := checkReturnRoute(netip.AddrPortFrom(a, b.Addr.Port())); err != nil {
			return nil, fmt.Errorf("backend %d: %w", b.Ordinal, err)
		}
		o.checked[a] = routeCheck{at: now}
	}
	return o, nil
}

// dial opens the session socket of f, once f's backend passed the return
// route check. The session table calls it under its lock, one worker's at
// a time; o's own lock guards the checks shared by the workers.
func (o *origSrc) dial(f flow) (*net.UDPConn, error) {
	if err := o.route(f.backend); err != nil {
		return nil, err
	}
	return dialOriginal(f.client, f.backend)
}

// route returns the last verdict on backend b's return route, checking it
// again when it failed more than routeRecheck ago (or never ran).
func (o *origSrc) route(b netip.AddrPort) error {
	a := b.Addr().Unmap()
	o.mu.Lock()
	defer o.mu.Unlock()
	c, ok := o.checked[a]
	if ok && (c.err == nil || time.Since(c.at) < routeRecheck) {
		return c.err
	}
	err := checkReturnRoute(b)
	if err != nil && (!ok || c.err == nil) {
		o.log.Error("original source: replies of a backend would not come back; its new sessions are dropped (send_error) until they would", "backend", b, "err", err)
	} else if err == nil && ok {
		o.log.Info("original source: a backend's return route is in place", "backend", b)
	}
	o.checked[a] = routeCheck{at: time.Now(), err: err}
	return err
}
