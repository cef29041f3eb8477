package proxyapp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
)

// Version is this build's version, logged at start and exchanged in a
// restart handover. Set it at link time:
//
//	go build -ldflags "-X github.com/cidroute/cidroute/examples/internal/proxyapp.Version=v1.2.3" ./examples/cidproxy
var Version = "dev"

// A restart handover replaces a running cidproxy with a new process (the
// same build, or another one) without losing a datagram. Every instance
// started with -handover PATH listens on the unix socket PATH; a new
// instance started with the same flag finds the running one there and
// takes its sockets over, passed as descriptors (SCM_RIGHTS): the
// services' sockets with their kernel queues and SO_REUSEPORT group, the
// upstream sockets whose ports the backends (and quic-go's paths) reply
// to, and the metrics listener. Nothing is closed or re-bound, so nothing
// queued is lost and no port changes.
//
// PATH's directory must be writable by this user only (checkHandoverDir),
// and each side checks the other's credentials (SO_PEERCRED: this uid or
// root), so that no other user can hand this process its sockets.
//
// The steps, with who reads the ports during each, and what each side
// does when the other vanishes (dies, or is told to stop) there:
//
//	step                               reads       the old vanishes      the new vanishes
//	1. new → old: hello                old         new starts afresh     old serves on
//	2. old → new: sockets, down marks  old         new serves alone (a)  old serves on
//	3. new serves; new → old: ready    old, new    new serves alone      old serves on
//	4. old stops reading, drains;      new         new serves alone      old serves again (b)
//	   old → new: done
//	5. new → old: bye; old exits 0     new         -                     old serves again (b)
//
// (a) once its pipeline is built, without waiting for the registries'
// first lists: nothing else reads the queues. (b) from duplicates of its
// sockets it kept at step 4, which also keep the queues alive while no
// process reads them. Bye is the commit: before sending it the new
// process declines the handover if told to stop (abort), so that a
// SIGTERM to either side leaves the other serving; after it, the new
// process is the only one, as after any start. The old one hands its
// sockets over even when told to stop during step 1: someone asked for
// them.

const (
	handoverFDsPerMsg = 200 // below the kernel's SCM_MAX_FD (253)
	handoverMaxMsg    = 1 << 20
)

// Bounds of a handover's steps, variables for tests.
var (
	// handoverReadyWait bounds step 3's wait for the registries.
	handoverReadyWait = 10 * time.Second
	// handoverStepWait bounds either side's wait for the other's next
	// message.
	handoverStepWait = 30 * time.Second
	// handoverResumeWait bounds the registries' wait of a process that
	// serves again after its successor vanished: the queues fill
	// meanwhile.
	handoverResumeWait = time.Second
)

// handoverStep, when set (tests only), is called at each step of the
// protocol: side is "predecessor" or "successor". A test stops a process
// there to kill it at that exact step.
var handoverStep func(ctx context.Context, side, step string)

func hoStep(ctx context.Context, side, step string) {
	if handoverStep != nil {
		handoverStep(ctx, side, step)
	}
}

// errHandoverPeer: the process at the other end of the handover socket
// is of another user.
var errHandoverPeer = errors.New("handover socket: the peer is another user's process")

// errHandoverDir: the handover socket's directory is writable by others.
var errHandoverDir = errors.New("handover socket: unsafe directory")

// hoMsg is one message of the handover protocol, JSON; the descriptors
// of Sockets travel with it, in order.
type hoMsg struct {
	Type    string     `json:"type"` // hello, sockets, ready, done, bye, abort
	PID     int        `json:"pid,omitempty"`
	Version string     `json:"version,omitempty"`
	Sockets []hoSocket `json:"sockets,omitempty"`
	More    bool       `json:"more,omitempty"` // more sockets follow
	// Down are the backends the old process's health checkers had marked
	// down, by service, so that the new one does not send them new
	// sessions until its own probes have spoken.
	Down   map[string][]registry.Backend `json:"down,omitempty"`
	Reason string                        `json:"reason,omitempty"` // abort
}

// hoSocket says what a passed descriptor is.
type hoSocket struct {
	Role   string `json:"role"`   // listen, upstream or metrics
	Listen string `json:"listen"` // the service's listen address (listen, upstream); the address (metrics)
}

// hoRecvd is one message read, or why none could be.
type hoRecvd struct {
	m   hoMsg
	err error
}

// inherited is what a new process received from its predecessor, or,
// without conn, what an old one kept of its own sockets to serve again.
type inherited struct {
	conn    *net.UnixConn
	log     *slog.Logger
	pid     int
	version string
	listen  map[netip.AddrPort][]*net.UDPConn // by listen address, in worker order
	up      map[netip.AddrPort][]*net.UDPConn
	metrics map[string]net.Listener
	down    map[string][]registry.Backend

	next chan hoRecvd  // the predecessor's message after the sockets (watch)
	gone chan struct{} // closed when the predecessor's end has closed
}

func newInherited(c *net.UnixConn, log *slog.Logger) *inherited {
	return &inherited{conn: c, log: log, listen: map[netip.AddrPort][]*net.UDPConn{},
		up: map[netip.AddrPort][]*net.UDPConn{}, metrics: map[string]net.Listener{}}
}

// takeOver connects to the cidproxy at path and receives its sockets; it
// returns nil, nil when no process is there (a first start, a stale
// socket file, or a predecessor that vanished before it sent them all:
// its sockets closed with it).
func takeOver(ctx context.Context, path string, log *slog.Logger) (*inherited, error) {
	c, err := dialHandover(path)
	if c == nil || err != nil {
		return nil, err
	}
	h := newInherited(c, log)
	fail := func(err error) (*inherited, error) {
		h.closeRest()
		c.Close()
		return nil, fmt.Errorf("handover from the cidproxy at %s: %w", path, err)
	}
	if err := h.send(hoMsg{Type: "hello", PID: os.Getpid(), Version: Version}, nil); err != nil {
		if predecessorGone(err) {
			h.closeRest()
			c.Close()
			log.Warn("handover: the predecessor went away before the hello; starting afresh", "path", path, "err", err)
			return nil, nil
		}
		return fail(err)
	}
	hoStep(ctx, "successor", "hello-sent")
	// Told to stop while it waits for the sockets: it stops; the
	// predecessor, its sockets refused, serves on.
	stopWaiting := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
	defer stopWaiting()
	n := 0
	for {
		m, files, err := recvHandover(c, time.Now().Add(handoverStepWait))
		if err != nil && ctx.Err() != nil {
			h.closeRest()
			c.Close()
			return nil, errDeclined
		}
		if errors.Is(err, errHandoverClosed) || predecessorGone(err) {
			h.closeRest()
			c.Close()
			log.Warn("handover: the predecessor went away before it passed its sockets; starting afresh", "path", path, "err", err)
			return nil, nil
		}
		if err != nil {
			return fail(err)
		}
		if m.Type != "sockets" || len(files) != len(m.Sockets) {
			closeFiles(files)
			return fail(fmt.Errorf("unexpected message %q with %d descriptors for %d sockets", m.Type, len(files), len(m.Sockets)))
		}
		h.pid, h.version, h.down = m.PID, m.Version, m.Down
		for i, s := range m.Sockets {
			if err := h.add(s, files[i]); err != nil {
				closeFiles(files[i+1:])
				return fail(err)
			}
			n++
		}
		if !m.More {
			break
		}
	}
	stopWaiting() // before watch: its read has no deadline
	h.next, h.gone = make(chan hoRecvd, 1), make(chan struct{})
	go h.watch()
	log.Info("handover: taking over", "from_pid", h.pid, "from_version", h.version, "version", Version, "sockets", n)
	hoStep(ctx, "successor", "sockets-received")
	return h, nil
}

// watch reads the predecessor's next message (done, after ready) as soon
// as it comes, so that its death is seen at once: the successor then
// serves without waiting for anything more.
func (h *inherited) watch() {
	m, files, err := recvHandover(h.conn, time.Time{})
	closeFiles(files)
	if err != nil {
		close(h.gone)
	}
	h.next <- hoRecvd{m, err}
}

// goneC is closed when the predecessor has gone; nil (never) without one.
func (h *inherited) goneC() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.gone
}

// add keeps one received descriptor (and closes the file: the net value
// holds its own duplicate).
func (h *inherited) add(s hoSocket, f *os.File) error {
	defer f.Close()
	if s.Role == "metrics" {
		ln, err := net.FileListener(f)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		h.metrics[s.Listen] = ln
		return nil
	}
	a, err := netip.ParseAddrPort(s.Listen)
	if err != nil {
		return fmt.Errorf("socket of %q: %w", s.Listen, err)
	}
	fc, err := net.FileConn(f)
	if err != nil {
		return fmt.Errorf("socket of %v: %w", a, err)
	}
	c, ok := fc.(*net.UDPConn)
	if !ok {
		fc.Close()
		return fmt.Errorf("socket of %v is not UDP", a)
	}
	switch s.Role {
	case "listen":
		h.listen[a] = append(h.listen[a], c)
	case "upstream":
		h.up[a] = append(h.up[a], c)
	default:
		c.Close()
		return fmt.Errorf("socket role %q", s.Role)
	}
	return nil
}

// adopt gives each service definition the sockets of its listen address,
// and the registries the predecessor's down marks. Sockets no service
// takes are closed: the predecessor's copies keep them open until it
// exits.
func (h *inherited) adopt(defs []cidroute.Service, regs *proxyconfig.Registries, log *slog.Logger) {
	if h == nil {
		return
	}
	for i := range defs {
		d := &defs[i]
		ls, ok := h.listen[d.Listen]
		if !ok {
			log.Info("handover: no socket of the predecessor's on this listen address; opening new ones", "service", d.Name, "listen", d.Listen)
			continue
		}
		delete(h.listen, d.Listen)
		d.Conns = ls
		ups := h.up[d.Listen]
		delete(h.up, d.Listen)
		if d.Transparent {
			closeConns(ups)
		} else {
			d.UpstreamConns = ups
		}
		if d.Workers != 0 && d.Workers < len(ls) {
			log.Warn("handover: workers is below the sockets inherited; serving every one of them (closing one would lose its queue); restart without -handover to shrink",
				"service", d.Name, "workers", d.Workers, "inherited", len(ls))
		}
		inheritMarks(regs, d.Name, h.down[d.Name], log) // health.go
	}
	for a, cs := range h.listen {
		log.Warn("handover: no service listens on an inherited address any more; its socket closes with the predecessor", "listen", a)
		closeConns(cs)
		closeConns(h.up[a])
		delete(h.up, a)
	}
	for _, cs := range h.up {
		closeConns(cs)
	}
	h.listen, h.up = nil, nil
}

// metricsListener returns the inherited metrics listener on addr, or nil.
func (h *inherited) metricsListener(addr string) net.Listener {
	if h == nil {
		return nil
	}
	ln := h.metrics[addr]
	delete(h.metrics, addr)
	return ln
}

// closeRest closes what nothing took.
func (h *inherited) closeRest() {
	if h == nil {
		return
	}
	for _, cs := range h.listen {
		closeConns(cs)
	}
	for _, cs := range h.up {
		closeConns(cs)
	}
	for _, ln := range h.metrics {
		ln.Close()
	}
	h.listen, h.up, h.metrics = nil, nil, nil
}

// abort tells the predecessor to go on serving.
func (h *inherited) abort(err error) {
	if h == nil {
		return
	}
	h.closeRest()
	if h.conn != nil {
		h.send(hoMsg{Type: "abort", Reason: err.Error()}, nil)
		h.conn.Close()
	}
}

// errDeclined: the successor was told to stop before the handover
// completed, and told its predecessor to serve on.
var errDeclined = errors.New("told to stop before the handover completed; the predecessor serves on")

// ready runs the successor's side of steps 3 to 5, with this process
// serving: it returns nil when this process goes on serving (the
// predecessor has stopped, or has gone: either way no other process
// reads the queues), or an error when the predecessor serves on and this
// process must stop (errDeclined when ctx is done first).
func (h *inherited) ready(ctx context.Context) error {
	if h == nil || h.conn == nil {
		return nil
	}
	h.closeRest()
	defer h.conn.Close()
	decline := func() error {
		h.send(hoMsg{Type: "abort", Reason: "the successor was told to stop"}, nil)
		return errDeclined
	}
	hoStep(ctx, "successor", "serving")
	if ctx.Err() != nil {
		return decline()
	}
	if err := h.send(hoMsg{Type: "ready", PID: os.Getpid(), Version: Version}, nil); err != nil {
		h.log.Warn("handover: the predecessor has gone before this process said ready; it serves alone", "from_pid", h.pid, "err", err)
		return nil
	}
	hoStep(ctx, "successor", "ready-sent")
	var r hoRecvd
	t := time.NewTimer(handoverStepWait)
	defer t.Stop()
	select {
	case r = <-h.next:
	case <-ctx.Done():
		return decline()
	case <-t.C:
		h.log.Warn("handover: no done from the predecessor; serving", "from_pid", h.pid, "wait", handoverStepWait)
		return nil
	}
	switch {
	case r.err != nil:
		h.log.Warn("handover: the predecessor has gone before it said done; this process serves alone", "from_pid", h.pid, "err", r.err)
		return nil
	case r.m.Type == "abort":
		return fmt.Errorf("the predecessor aborted: %s", r.m.Reason)
	case r.m.Type != "done":
		h.log.Warn("handover: unexpected message instead of done; serving", "from_pid", h.pid, "message", r.m.Type)
		return nil
	}
	hoStep(ctx, "successor", "done-received")
	if ctx.Err() != nil {
		return decline()
	}
	if err := h.send(hoMsg{Type: "bye", PID: os.Getpid()}, nil); err != nil {
		h.log.Warn("handover: the predecessor has gone before bye; this process serves alone", "from_pid", h.pid, "err", err)
		return nil
	}
	h.log.Info("handover: the predecessor has stopped; this process serves alone", "from_pid", h.pid)
	return nil
}

func (h *inherited) send(m hoMsg, conns []syscall.Conn) error {
	return sendHandover(h.conn, m, conns, time.Now().Add(handoverStepWait))
}

var errHandoverClosed = errors.New("handover: connection closed")

// predecessorGone reports whether err says the other end of the handover
// connection died: reset (killed with the connection still in its accept
// queue, or unread) or closed (a broken pipe).
func predecessorGone(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func closeConns(cs []*net.UDPConn) {
	for _, c := range cs {
		c.Close()
	}
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func marshalHandover(m hoMsg) ([]byte, error) {
	b, err := json.Marshal(m)
	if err == nil && len(b) > handoverMaxMsg {
		err = fmt.Errorf("handover message of %d bytes", len(b))
	}
	return b, err
}

func unmarshalHandover(b []byte) (hoMsg, error) {
	var m hoMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("handover message: %w", err)
	}
	return m, nil
}

// waitBackends waits until every service's registry has its first list,
// so that a successor routes from its first datagram; it returns nil at
// once when gone closes (no other process reads the queues: better
// serve now).
func (p *proxy) waitBackends(ctx context.Context, within time.Duration, gone <-chan struct{}) error {
	deadline := time.Now().Add(within)
	for {
		var missing []string
		for _, name := range p.serviceNames() {
			if reg, ok := p.regs.Registry(name); ok && reg.Snapshot().Len() == 0 {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no backends after %v for services %v", within, missing)
		}
		select {
		case <-gone:
			p.log.Warn("handover: the predecessor has gone; serving before every registry has its first list", "missing", missing)
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// hoResult is how the old side of a handover ended.
type hoResult struct {
	took   bool       // the successor serves (or will, alone): this process stops
	resume *inherited // the successor vanished after this process stopped reading: serve again on these
}

// handOver is the old side of a handover, for one successor: it sends the
// sockets, and once the successor serves, drains the pipeline, says done
// and waits for bye. With neither took nor resume this process goes on
// serving. It runs off the signal loop, which goes on reloading; state
// holds that loop's changes (reloads) out while it collects the sockets
// and detaches the fast path.
func (p *proxy) handOver(ctx context.Context, c *net.UnixConn, hello hoMsg, metrics *metricsServer, metricsAddr string, drain time.Duration, state *sync.Mutex) hoResult {
	log := p.log.With("successor_pid", hello.PID, "successor_version", hello.Version)
	log.Info("handover: a successor asks for the sockets")
	defer c.Close()
	hoStep(ctx, "predecessor", "hello-received")
	state.Lock()
	files, socks, err := p.handoverConns(metrics, metricsAddr)
	down := p.downMarks()
	state.Unlock()
	if err != nil {
		log.Error("handover refused: the sockets cannot be passed", "err", err)
		sendHandover(c, hoMsg{Type: "abort", Reason: err.Error()}, nil, time.Now().Add(time.Second))
		return hoResult{}
	}
	for i := 0; i == 0 || i < len(files); i += handoverFDsPerMsg {
		j := min(i+handoverFDsPerMsg, len(files))
		m := hoMsg{Type: "sockets", PID: os.Getpid(), Version: Version, Sockets: socks[i:j], More: j < len(files), Down: down}
		if err := sendHandover(c, m, files[i:j], time.Now().Add(handoverStepWait)); err != nil {
			log.Error("handover aborted: sending the sockets", "err", err)
			return hoResult{}
		}
	}
	hoStep(ctx, "predecessor", "sockets-sent")
	got := make(chan hoRecvd, 1)
	go func() {
		m, fs, err := recvHandover(c, time.Now().Add(handoverStepWait))
		closeFiles(fs)
		got <- hoRecvd{m, err}
	}()
	var r hoRecvd
	select {
	case r = <-got:
	case <-ctx.Done(): // told to stop: the successor, seeing this end close, serves alone
		c.Close()
		<-got
		log.Warn("handover: this process was told to stop; the successor serves alone")
		return hoResult{took: true}
	}
	switch {
	case r.err != nil:
		log.Error("handover aborted: the successor went away before it served; this process goes on", "err", r.err)
		return hoResult{}
	case r.m.Type == "abort":
		log.Error("handover aborted by the successor; this process goes on", "reason", r.m.Reason)
		return hoResult{}
	case r.m.Type != "ready":
		log.Error("handover aborted: unexpected message; this process goes on", "message", r.m.Type)
		return hoResult{}
	}
	hoStep(ctx, "predecessor", "ready-received")
	// Copies of the sockets, to serve again should the successor vanish
	// before bye; they also keep the queues while nobody reads them.
	keep, err := p.keepSockets(files, socks, down)
	if err != nil {
		log.Error("handover aborted: the sockets cannot be kept; this process goes on", "err", err)
		sendHandover(c, hoMsg{Type: "abort", Reason: err.Error()}, nil, time.Now().Add(time.Second))
		return hoResult{}
	}
	log.Info("handover: the successor serves; draining", "transparent_drain", drain)
	p.stopping.Store(true)
	state.Lock()
	p.closeXDP() // the sockets get everything until the successor attaches its own
	state.Unlock()
	dctx, cancel := context.WithTimeout(context.Background(), drain)
	err = p.pipe.Drain(dctx)
	cancel()
	if err != nil {
		log.Error("handover: the pipeline stopped with an error", "err", err)
	}
	hoStep(ctx, "predecessor", "drained")
	if err := sendHandover(c, hoMsg{Type: "done", PID: os.Getpid()}, nil, time.Now().Add(time.Second)); err != nil {
		log.Error("handover: the successor vanished before done; this process serves again", "err", err)
		return hoResult{resume: keep}
	}
	hoStep(ctx, "predecessor", "done-sent")
	// Told to stop meanwhile, it waits no longer: the successor, still
	// connected, serves.
	stopWaiting := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
	m, fs, err := recvHandover(c, time.Now().Add(handoverStepWait))
	stopWaiting()
	closeFiles(fs)
	switch {
	case err == nil && m.Type == "bye":
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Alive but silent (or this process told to stop): it holds the
		// sockets and serves; two readers would be harmless, but a
		// process that never stops is not.
		log.Warn("handover: no bye from the successor, which is still connected; stopping", "told_to_stop", ctx.Err() != nil)
	default:
		log.Error("handover: the successor vanished before bye; this process serves again", "err", err, "message", m.Type, "reason", m.Reason)
		return hoResult{resume: keep}
	}
	keep.closeRest()
	log.Info("handover done: this process stops")
	return hoResult{took: true}
}

// downMarks are the backends the health checkers have marked down, by
// service: every mark a checker holds, whatever the backend's state now
// (a draining backend's mark must outlive the handover too, or it would
// take new sessions unprobed once ready again).
func (p *proxy) downMarks() map[string][]registry.Backend {
	down := map[string][]registry.Backend{}
	for _, name := range p.serviceNames() {
		if c, ok := p.regs.Checker(name); ok && c != nil {
			if marks := c.Down(); len(marks) > 0 {
				down[name] = marks
			}
		}
	}
	return down
}

// keepSockets duplicates the sockets passed, as an inheritance without a
// predecessor, from which this process can serve again.
func (p *proxy) keepSockets(conns []syscall.Conn, socks []hoSocket, down map[string][]registry.Backend) (*inherited, error) {
	h := newInherited(nil, p.log)
	h.down = down
	for i, c := range conns {
		f, err := dupFile(c)
		if err == nil {
			err = h.add(socks[i], f)
		}
		if err != nil {
			h.closeRest()
			return nil, err
		}
	}
	return h, nil
}

// handoverConns lists every socket to pass to the successor. The
// descriptors go as they are (sendHandover): not through File, whose Fd
// would make the shared socket blocking under this process's readers.
func (p *proxy) handoverConns(metrics *metricsServer, metricsAddr string) ([]syscall.Conn, []hoSocket, error) {
	var conns []syscall.Conn
	var socks []hoSocket
	for _, name := range p.serviceNames() {
		listen, ups, _ := p.pipe.Sockets(name)
		addr, _ := p.pipe.Addr(name)
		for _, c := range listen {
			conns = append(conns, c)
			socks = append(socks, hoSocket{Role: "listen", Listen: addr.String()})
		}
		for _, c := range ups {
			conns = append(conns, c)
			socks = append(socks, hoSocket{Role: "upstream", Listen: addr.String()})
		}
	}
	if metrics != nil {
		tl, ok := metrics.ln.(*net.TCPListener)
		if !ok {
			return nil, nil, fmt.Errorf("metrics listener %T", metrics.ln)
		}
		conns = append(conns, tl)
		socks = append(socks, hoSocket{Role: "metrics", Listen: metricsAddr})
	}
	return conns, socks, nil
}
