package cidroute

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/udpio"
)

// A worker serves one SO_REUSEPORT socket of a service: it reads a batch
// of client datagrams, applies the forward rule to each and hands the
// routed ones to its upstream, which sends them to the backends and
// relays the replies. It moves bytes; the Router decides. All batch state
// is allocated here, once.
type worker struct {
	conn   *net.UDPConn // the service socket
	in     *udpio.Conn
	router *Router
	own    *atomic.Pointer[OwnAddrs]
	adm    atomic.Pointer[Admission] // nil when every limit is off; SetLimits swaps it
	up     upstream
	rp     *replies       // the upstream's, for the reverse counters
	lenLog *lengthWarning // the service's, or nil

	fwdIn, fwdOut []udpio.Message
	from          []Session // the client of fwdOut[i], and where it sent
	fwd           liveCounters

	// poll is the Poller of WaitThread: the worker's one loop waits in it
	// for the service socket and, in PPv2 mode, the upstream socket; nil
	// with the netpoller.
	poll  *udpio.Poller
	yield yielder // the thread loop's (yieldEvery)

	early *earlyDrop // Service.EarlyDrop's filter, or nil
	stall *stall     // tests only
}

// A stall makes a worker slower than its senders on any machine, for the
// overload tests: a pause after every batch read, per direction (forward,
// reverse). nil outside tests.
type stall [2]time.Duration

func (s *stall) after(dir int) {
	if s != nil && s[dir] > 0 {
		time.Sleep(s[dir])
	}
}

// An upstream is the worker's side towards the backends, chosen when the
// worker is built: one shared socket with PPv2 headers, or transparent
// mode's sessions.
type upstream interface {
	// send sends a routed batch: out[i] (to its backend) came from
	// from[i]. It counts each datagram into c.
	send(out []udpio.Message, from []Session, c *Counters) error
	// serve relays replies to clients until wake or close; it returns nil
	// after a shutdown. In WaitThread mode the shared upstream's replies
	// are relayed by the worker's thread instead (relayBatch), and serve
	// only runs transparent mode's session sweep.
	serve() error
	// replyConn is the socket replies arrive on, for the worker's Poller
	// (nil for transparent sessions, whose goroutines relay them), and
	// relayBatch relays one batch from it: the read's error (ErrWouldBlock
	// when none was queued) and the send's.
	replyConn() *udpio.Conn
	relayBatch() (n int, rerr, err error)
	// wake makes serve return without closing anything, so that batches
	// in flight are still sent.
	wake()
	// close closes the upstream's sockets and waits for its goroutines.
	close()
	// addrs returns the addresses of the sockets that receive replies
	// (none for transparent sessions, whose sockets are connected).
	addrs() []netip.AddrPort
	// sessions returns the number of transparent sessions, and evicted
	// how many a full table expired early.
	sessions() int
	evicted() uint64
	// queue adds the kernel's drops and queue of the sockets that
	// receive replies to c (none for transparent sessions).
	queue(c *Counters)
}

// newWorker builds the worker of socket in, with the upstream up.
func newWorker(in *net.UDPConn, r *Router, own *atomic.Pointer[OwnAddrs], adm *Admission, batch, maxDatagram int) (*worker, error) {
	conn, err := udpio.NewConn(in, batch)
	if err != nil {
		return nil, err
	}
	w := &worker{conn: in, in: conn, router: r, own: own,
		fwdIn: rxMessages(batch, maxDatagram), fwdOut: make([]udpio.Message, batch), from: make([]Session, batch)}
	w.adm.Store(adm)
	hdrs := make([]byte, batch*HeaderRoom)
	for i := range w.fwdOut {
		w.fwdOut[i].Prefix = hdrs[i*HeaderRoom : i*HeaderRoom : (i+1)*HeaderRoom]
	}
	return w, nil
}

func rxMessages(n, size int) []udpio.Message {
	ms := make([]udpio.Message, n)
	slab := make([]byte, n*size)
	for i := range ms {
		ms[i].Buf = slab[i*size : (i+1)*size : (i+1)*size]
	}
	return ms
}

// forwardLoop moves client datagrams to backends until the socket is
// closed or its read deadline passes (shutdown).
func (w *worker) forwardLoop() error {
	var c Counters
	for {
		_, rerr, err := w.forwardBatch(&c)
		if rerr != nil {
			return ended(rerr)
		}
		if err != nil {
			return err
		}
	}
}

// threadLoop is the WaitThread worker: one goroutine waits in the
// worker's Poller, blocking its OS thread, whichever of its sockets has
// datagrams, and forwards or relays them until Wake. While datagrams keep
// coming the goroutine yields every yieldEvery.
//
// Past capacity both directions are served a batch at a time, in turns:
// the first round after a wait reads the sockets the Poller reported, and
// while any batch comes back full every later round reads both, the one
// that came back short or empty included. An earlier loop trusted a short
// batch until the next wait, which never came while the client socket
// stayed full: under forward overload it relayed one socket buffer of
// replies and then none (10,082 of ~600k on the independent benchmark).
// Reading the short socket again costs one recvmmsg, at worst an empty
// one, per full batch of the other, and nothing below saturation, where
// batches are short and the loop goes back to the wait; a zero-timeout
// epoll_wait to ask first would cost the same syscall and read nothing.
//
// The goroutine is not locked to its thread: a locked goroutine's yield
// is a handoff through a second thread, which must be scheduled to hand
// the P back, and on a busy CPU that took 0.5–4 ms a few times a second
// (traced at 50k datagrams/s); unlocked, the yield reschedules it on the
// same thread or the one the runtime wakes, whichever comes first.
func (w *worker) threadLoop() error {
	var c Counters
	ready := make([]bool, w.polled())
	full := len(w.fwdIn)
	y := &w.yield
	for {
		woken, err := w.poll.Wait(ready)
		if woken || err != nil {
			return err
		}
		for more := true; more; {
			y.batch(time.Now())
			more = false
			if ready[0] {
				n, rerr, err := w.forwardBatch(&c)
				if err := loopErr(rerr, err); err != nil {
					return err
				}
				more = n == full
			}
			if len(ready) == 2 && ready[1] {
				n, rerr, err := w.up.relayBatch()
				if err := loopErr(rerr, err); err != nil {
					return err
				}
				more = more || n == full
			}
			for i := range ready {
				ready[i] = true // past the first round: both, every round
			}
		}
	}
}

// loopErr is what ends a thread loop after a batch: a read error other
// than an empty queue (ErrWouldBlock), or a send error.
func loopErr(rerr, err error) error {
	if rerr != nil && !errors.Is(rerr, udpio.ErrWouldBlock) {
		return ended(rerr)
	}
	return err
}

// polled is the number of the worker's sockets in its Poller.
func (w *worker) polled() int {
	if w.up.replyConn() != nil {
		return 2
	}
	return 1
}

// forwardBatch reads one batch of client datagrams and sends those the
// forward rule routes; it returns the read's error (the loop's end, or
// ErrWouldBlock) and the send's.
func (w *worker) forwardBatch(c *Counters) (n int, rerr, err error) {
	n, rerr = w.in.ReadBatch(w.fwdIn)
	if rerr != nil {
		return 0, rerr, nil
	}
	w.stall.after(0)
	v := View{Snapshot: w.router.backends.Snapshot(), Stale: w.router.backends.Stale(),
		Own: w.own.Load(), Admission: w.adm.Load()}
	if v.Admission != nil {
		v.Now = time.Now().UnixNano() // once per batch, and only with limits
	}
	if w.early.stale(v.Snapshot) {
		w.early.sync() // a failure removes the filter; the watcher logs it
	}
	c.batch(n)
	seenLen := 0 // the length of a CID dropped as CIDLength
	out := w.fwdOut[:0]
	for i := range w.fwdIn[:n] {
		m := &w.fwdIn[i]
		if m.Err != nil {
			c.Dropped[TooBig]++ // larger than MaxDatagram: truncated
			continue
		}
		o := &w.fwdOut[len(out)]
		d, hdr := w.router.Forward(o.Prefix[:0], m.Buf[:m.N], m.Addr, m.Local, &v)
		if d.Reason != Forwarded {
			c.Dropped[d.Reason]++
			if d.Reason == CIDLength {
				seenLen = len(d.Class.ID)
			}
			continue
		}
		o.Prefix, o.Buf, o.Addr, o.Local = hdr, m.Buf[:m.N], d.Backend, netip.Addr{}
		w.from[len(out)] = Session{Client: m.Addr, Local: m.Local}
		out = out[:len(out)+1]
	}
	err = w.up.send(out, w.from, c)
	w.fwd.flush(c)
	if seenLen != 0 && w.lenLog != nil {
		w.lenLog.note(seenLen)
	}
	return n, nil, err
}

// loops are the worker's goroutines: the forward loop and the upstream's
// reply loop, or in WaitThread mode the thread's loop (and transparent
// mode's session sweep).
func (w *worker) loops() []func() error {
	if w.poll == nil {
		return []func() error{w.forwardLoop, w.up.serve}
	}
	if w.up.replyConn() != nil {
		return []func() error{w.threadLoop}
	}
	return []func() error{w.threadLoop, w.up.serve}
}

// thread puts the worker on a thread of its own (WaitThread): its sockets
// leave the netpoller for a Poller. false when the platform has none; the
// worker then stays on the netpoller.
func (w *worker) thread() bool {
	conns := []*udpio.Conn{w.in}
	if u := w.up.replyConn(); u != nil {
		conns = append(conns, u)
	}
	for _, c := range conns {
		if c.Detach() != nil {
			return false // not Linux: nothing was detached
		}
	}
	p, err := udpio.NewPoller(conns...)
	if err != nil {
		return false
	}
	w.poll = p
	threads.Add(1)
	return true
}

// threads counts the WaitThread workers of the process, every Pipeline's:
// each holds a thread blocked in epoll_wait, and GOMAXPROCS must stay
// above their number.
var threads atomic.Int32

// ended maps the read error that ends a loop: a shutdown is not an error.
func ended(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("receive: %w", err)
}

// wake makes the loops return soon, without closing a socket: batches in
// flight are still sent.
func (w *worker) wake() {
	w.stopReading()
	w.up.wake()
}

// stopReading ends the reads of the service socket and, with WaitThread,
// of the upstream socket too (the same thread reads both). It leaves the
// sockets as they are, which a successor in a restart handover shares.
func (w *worker) stopReading() {
	if w.poll != nil {
		w.poll.Wake()
		return
	}
	w.conn.SetReadDeadline(time.Unix(1, 0))
}

// addQueue adds the kernel's drop count and queue gauges of socket c to
// cnt (nothing where the platform does not report them).
func addQueue(cnt *Counters, c syscall.Conn) {
	m, err := udpio.ReadMemInfo(c)
	if err != nil {
		return
	}
	cnt.KernelDrops += uint64(m.Drops)
	cnt.Queued += uint64(m.Queued)
	cnt.QueueLimit += uint64(m.Limit)
}

// heldThreads is the number of OS threads the worker's loops hold
// blocked in the kernel.
func (w *worker) heldThreads() int {
	if w.poll != nil {
		return 1
	}
	return 0
}

// close closes the upstream (ending transparent sessions), then the
// service socket.
func (w *worker) close() {
	w.up.close()
	w.in.Close()
	if w.poll != nil {
		w.poll.Close()
		threads.Add(-1)
	}
}

// lengthWarnEvery is how often a service logs that its datagrams carry
// CIDs of another length.
const lengthWarnEvery = 10 * time.Second

// A lengthWarning logs, at most once per lengthWarnEvery for its service,
// that datagrams were dropped as CIDLength: a misconfiguration whose every
// handshake otherwise just times out. It runs after a batch that had such
// a drop, never on the forwarding path.
type lengthWarning struct {
	log  *slog.Logger
	want int          // the service's CID length
	last atomic.Int64 // Unix nanoseconds of the last line, 0 for none
}

func (l *lengthWarning) note(seen int) {
	now := time.Now().UnixNano()
	last := l.last.Load()
	if (last != 0 && now-last < int64(lengthWarnEvery)) || !l.last.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn("datagrams carry connection IDs of another length than the service's, dropped as cid_length: configure the backends and the proxy with one CID length",
		"cid_len", l.want, "seen_len", seen)
}
