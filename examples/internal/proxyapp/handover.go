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
// queued is lost and no port changes. The steps:
//
//  1. new → old: hello (pid, version).
//  2. old → new: the sockets (in messages of at most handoverFDsPerMsg
//     descriptors) and the health checkers' down marks.
//  3. new: builds its pipeline on them (sockets its configuration no
//     longer uses are closed; services it adds get new ones), waits for
//     every registry's first list, starts serving, then → old: ready.
//  4. old: stops reading (the new one reads the same queues), sends what
//     it had read, lets transparent sessions relay for -handover-drain,
//     → new: done, and exits 0 with its final counters logged.
//  5. new: attaches the XDP fast path, if configured, and listens on
//     PATH for its own successor.
//
// If the new process fails before step 3 ends (a bad configuration, a
// source that never answers), it closes the connection and exits 1; the
// old one logs it and goes on serving.

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
)

// hoMsg is one message of the handover protocol, JSON; the descriptors
// of Sockets travel with it, in order.
type hoMsg struct {
	Type    string     `json:"type"` // hello, sockets, ready, done, abort
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

// inherited is what a new process received from its predecessor.
type inherited struct {
	conn    *net.UnixConn
	log     *slog.Logger
	pid     int
	version string
	listen  map[netip.AddrPort][]*net.UDPConn // by listen address, in worker order
	up      map[netip.AddrPort][]*net.UDPConn
	metrics map[string]net.Listener
	down    map[string][]registry.Backend
}

// takeOver connects to the cidproxy at path and receives its sockets; it
// returns nil, nil when no process is there (a first start, or a stale
// socket file).
func takeOver(ctx context.Context, path string, log *slog.Logger) (*inherited, error) {
	c, err := dialHandover(path)
	if c == nil || err != nil {
		return nil, err
	}
	h := &inherited{conn: c, log: log, listen: map[netip.AddrPort][]*net.UDPConn{},
		up: map[netip.AddrPort][]*net.UDPConn{}, metrics: map[string]net.Listener{}}
	fail := func(err error) (*inherited, error) {
		h.closeRest()
		c.Close()
		return nil, fmt.Errorf("handover from the cidproxy at %s: %w", path, err)
	}
	if err := h.send(hoMsg{Type: "hello", PID: os.Getpid(), Version: Version}, nil); err != nil {
		return fail(err)
	}
	n := 0
	for {
		m, files, err := recvHandover(c, time.Now().Add(handoverStepWait))
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
				closeFiles(files[i:])
				return fail(err)
			}
			n++
		}
		if !m.More {
			break
		}
	}
	log.Info("handover: taking over", "from_pid", h.pid, "from_version", h.version, "version", Version, "sockets", n)
	return h, nil
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
	h.send(hoMsg{Type: "abort", Reason: err.Error()}, nil)
	h.conn.Close()
}

// ready tells the predecessor that this process serves; then it waits
// for the predecessor to finish (done, or the connection closing).
func (h *inherited) ready() error {
	h.closeRest()
	if err := h.send(hoMsg{Type: "ready", PID: os.Getpid(), Version: Version}, nil); err != nil {
		return err
	}
	m, files, err := recvHandover(h.conn, time.Now().Add(handoverStepWait))
	closeFiles(files)
	h.conn.Close()
	switch {
	case err == nil && m.Type == "done":
		h.log.Info("handover: the predecessor has stopped; this process serves alone", "from_pid", h.pid)
	case errors.Is(err, errHandoverClosed):
		h.log.Warn("handover: the predecessor closed the connection without saying done; it has gone", "from_pid", h.pid)
	case err == nil && m.Type == "abort":
		return fmt.Errorf("the predecessor aborted: %s", m.Reason)
	default:
		h.log.Warn("handover: no done from the predecessor", "from_pid", h.pid, "err", err, "message", m.Type)
	}
	return nil
}

func (h *inherited) send(m hoMsg, conns []syscall.Conn) error {
	return sendHandover(h.conn, m, conns, time.Now().Add(handoverStepWait))
}

var errHandoverClosed = errors.New("handover: connection closed")

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
// so that a successor routes from its first datagram.
func (p *proxy) waitBackends(ctx context.Context, within time.Duration) error {
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
		time.Sleep(10 * time.Millisecond)
	}
}

// handOver is the old side of a handover, for one successor: it sends the
// sockets, and once the successor serves, drains the pipeline and says
// done. It reports whether the successor took over; if not, this process
// goes on serving.
func (p *proxy) handOver(ctx context.Context, c *net.UnixConn, hello hoMsg, metrics *metricsServer, drain time.Duration) bool {
	log := p.log.With("successor_pid", hello.PID, "successor_version", hello.Version)
	log.Info("handover: a successor asks for the sockets")
	defer c.Close()
	files, socks, err := p.handoverConns(metrics)
	if err != nil {
		log.Error("handover refused: the sockets cannot be passed", "err", err)
		sendHandover(c, hoMsg{Type: "abort", Reason: err.Error()}, nil, time.Now().Add(time.Second))
		return false
	}
	down := map[string][]registry.Backend{}
	for _, name := range p.serviceNames() {
		if reg, ok := p.regs.Registry(name); ok {
			snap := reg.Snapshot()
			for _, b := range snap.Backends() {
				if snap.Down(b.Ordinal) {
					down[name] = append(down[name], b)
				}
			}
		}
	}
	for i := 0; i == 0 || i < len(files); i += handoverFDsPerMsg {
		j := min(i+handoverFDsPerMsg, len(files))
		m := hoMsg{Type: "sockets", PID: os.Getpid(), Version: Version, Sockets: socks[i:j], More: j < len(files), Down: down}
		if err := sendHandover(c, m, files[i:j], time.Now().Add(handoverStepWait)); err != nil {
			log.Error("handover aborted: sending the sockets", "err", err)
			return false
		}
	}
	type recvd struct {
		m   hoMsg
		err error
	}
	got := make(chan recvd, 1)
	go func() {
		m, fs, err := recvHandover(c, time.Now().Add(handoverStepWait))
		closeFiles(fs)
		got <- recvd{m, err}
	}()
	var r recvd
	select {
	case r = <-got:
	case <-ctx.Done(): // a stop signal: stop, as if no successor had come
		c.Close()
		<-got
		log.Warn("handover aborted: this process was told to stop")
		return false
	}
	m, err := r.m, r.err
	switch {
	case err != nil:
		log.Error("handover aborted: the successor went away before it served; this process goes on", "err", err)
		return false
	case m.Type == "abort":
		log.Error("handover aborted by the successor; this process goes on", "reason", m.Reason)
		return false
	case m.Type != "ready":
		log.Error("handover aborted: unexpected message; this process goes on", "message", m.Type)
		return false
	}
	log.Info("handover: the successor serves; draining", "transparent_drain", drain)
	p.stopping.Store(true)
	p.closeXDP() // the sockets get everything until the successor attaches its own
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	err = p.pipe.Drain(ctx)
	cancel()
	if err != nil {
		log.Error("handover: the pipeline stopped with an error", "err", err)
	}
	if err := sendHandover(c, hoMsg{Type: "done", PID: os.Getpid()}, nil, time.Now().Add(time.Second)); err != nil {
		log.Warn("handover: telling the successor done", "err", err)
	}
	log.Info("handover done: this process stops")
	return true
}

// handoverConns lists every socket to pass to the successor. The
// descriptors go as they are (sendHandover): not through File, whose Fd
// would make the shared socket blocking under this process's readers.
func (p *proxy) handoverConns(metrics *metricsServer) ([]syscall.Conn, []hoSocket, error) {
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
		socks = append(socks, hoSocket{Role: "metrics", Listen: p.cur.MetricsListen})
	}
	return conns, socks, nil
}
