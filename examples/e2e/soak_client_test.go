package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
)

// A soakClient is one legitimate device: a pion/dtls v3 client with CID
// on a soakSock. Its counters are written by the goroutine driving it and
// read by the test once the driver stopped.
type soakClient struct {
	id   int
	sock *soakSock
	conn *pion.Conn
	buf  []byte
	seq  int

	tries int           // sends per message before it counts as failed
	wait  time.Duration // for each echo

	asks, answered, failed, retries, late, misrouted atomic.Int64
	// writes counts the records sent, echoes the echoes of them that came
	// back (answers and late ones): after a drain, the difference is what
	// was lost on the way.
	writes, echoes atomic.Int64
}

var errSoakNoReply = errors.New("soak: no reply")

// soakDial handshakes a new client through via.
func soakDial(ctx context.Context, id int, via netip.AddrPort, timeout time.Duration) (*soakClient, error) {
	sock, err := soakListen(via, soakPublic)
	if err != nil {
		return nil, err
	}
	conn, err := pion.Client(sock, net.UDPAddrFromAddrPort(soakPublic), dtlsecho.PSKClientConfig(soakPSK, "soak"))
	if err != nil {
		sock.Close()
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := conn.HandshakeContext(hctx); err != nil {
		conn.Close()
		sock.Close()
		return nil, fmt.Errorf("client %d handshake via %v: %w", id, via, err)
	}
	return &soakClient{id: id, sock: sock, conn: conn, buf: make([]byte, 2048), tries: 5, wait: soakWait}, nil
}

// soakDialMany handshakes n clients, client i through vias[i%len(vias)],
// a few at a time. A handshake that fails is tried again (up to 3 times
// in all) and counted in redials.
func soakDialMany(t *testing.T, first, n int, vias ...netip.AddrPort) (cs []*soakClient, redials int) {
	t.Helper()
	cs = make([]*soakClient, n)
	var mu sync.Mutex
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			for try := range 3 {
				c, err := soakDial(t.Context(), first+i, vias[i%len(vias)], 5*time.Second)
				if err == nil {
					cs[i], errs[i] = c, nil
					return
				}
				errs[i] = err
				if try < 2 {
					mu.Lock()
					redials++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for _, c := range cs {
				if c != nil {
					c.close()
				}
			}
			require.NoError(t, err, "client %d", first+i)
		}
	}
	return cs, redials
}

func (c *soakClient) close() {
	c.conn.Close()
	c.sock.Close()
}

// release drops the closed client's pion connection (its buffers), so
// that the heap measured afterwards holds only what it left behind.
func (c *soakClient) release() { c.conn = nil }

// ordinal is the backend ordinal written in the session's CID (byte 0,
// ordinal-first), or -1 before the client sent a tls12_cid record.
func (c *soakClient) ordinal() int {
	if cid := c.sock.CID(); len(cid) > 0 {
		return int(cid[0])
	}
	return -1
}

// ask sends one unique message and waits for its echo, "<ordinal>|msg",
// resending it up to c.tries times. An echo of an earlier message that
// arrives late is skipped and counted. An echo from a backend other than
// the one the CID names is a misroute.
func (c *soakClient) ask() error {
	c.seq++
	msg := fmt.Appendf(nil, "c%d-m%d", c.id, c.seq)
	c.asks.Add(1)
	for try := range c.tries {
		if try > 0 {
			c.retries.Add(1)
		}
		if _, err := c.conn.Write(msg); err != nil {
			c.failed.Add(1)
			return err
		}
		c.writes.Add(1)
		deadline := time.Now().Add(c.wait)
		for {
			c.conn.SetReadDeadline(deadline)
			answer, err := c.read(msg)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			if err != nil {
				c.failed.Add(1)
				return err
			}
			if answer {
				c.answered.Add(1)
				return nil
			}
		}
	}
	c.failed.Add(1)
	return errSoakNoReply
}

// read reads one echo and reports whether it answers msg; any other echo
// of this client's messages is a late one.
func (c *soakClient) read(msg []byte) (bool, error) {
	n, err := c.conn.Read(c.buf)
	if err != nil {
		return false, err
	}
	ord, rest, _ := bytes.Cut(c.buf[:n], []byte("|"))
	if o, err := strconv.Atoi(string(ord)); err != nil || o != c.ordinal() {
		c.misrouted.Add(1)
	}
	c.echoes.Add(1)
	if bytes.Equal(rest, msg) {
		return true, nil
	}
	c.late.Add(1)
	return false, nil
}

// soakWait is how long a client waits for an echo before resending.
var soakWait = 500 * time.Millisecond

// soakDrainWait bounds how long a stopped client waits for the echoes of
// its resent records.
var soakDrainWait = time.Second

// drain reads the echoes still owed to the client, until none is owed or
// soakDrainWait passed, so that writes − echoes is what was lost.
func (c *soakClient) drain() {
	deadline := time.Now().Add(soakDrainWait)
	for c.writes.Load() > c.echoes.Load() && time.Now().Before(deadline) {
		c.conn.SetReadDeadline(deadline)
		if _, err := c.read(nil); err != nil {
			return
		}
	}
}

// A soakDriver runs closed-loop traffic: every client asks, pauses, asks
// again, until Stop. A client whose ask fails stops (its session is
// considered dead; the scenario decides whether that is allowed).
type soakDriver struct {
	cs   []*soakClient
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func soakDrive(cs []*soakClient, pause time.Duration, before func(c *soakClient, k int)) *soakDriver {
	d := &soakDriver{cs: cs, stop: make(chan struct{})}
	for _, c := range cs {
		d.wg.Go(func() {
			t := time.NewTimer(0)
			defer t.Stop()
			for k := 0; ; k++ {
				select {
				case <-d.stop:
					return
				case <-t.C:
				}
				if before != nil {
					before(c, k)
				}
				if c.ask() != nil {
					return
				}
				t.Reset(pause)
			}
		})
	}
	return d
}

// soakDriveEvery is soakDrive with one ask per period per client, started
// on a ticker (a tick that comes while an ask is under way is skipped).
func soakDriveEvery(cs []*soakClient, period time.Duration) *soakDriver {
	d := &soakDriver{cs: cs, stop: make(chan struct{})}
	for _, c := range cs {
		d.wg.Go(func() {
			tk := time.NewTicker(period)
			defer tk.Stop()
			for {
				select {
				case <-d.stop:
					return
				case <-tk.C:
				}
				if c.ask() != nil {
					return
				}
			}
		})
	}
	return d
}

// Stop stops the clients and lets each collect the echoes it is owed.
func (d *soakDriver) Stop() {
	d.once.Do(func() {
		close(d.stop)
		d.wg.Wait()
		var wg sync.WaitGroup
		for _, c := range d.cs {
			wg.Go(c.drain)
		}
		wg.Wait()
	})
}

// soakTally sums clients' counters.
type soakTally struct {
	Asks, Answered, Failed, Retries, Late, Misrouted, Writes, Echoes, Sent, Recv, Rebinds int64
}

func soakSum(cs ...[]*soakClient) soakTally {
	var t soakTally
	for _, list := range cs {
		for _, c := range list {
			t.Asks += c.asks.Load()
			t.Answered += c.answered.Load()
			t.Failed += c.failed.Load()
			t.Retries += c.retries.Load()
			t.Late += c.late.Load()
			t.Writes += c.writes.Load()
			t.Echoes += c.echoes.Load()
			t.Misrouted += c.misrouted.Load()
			t.Sent += int64(c.sock.sent.Load())
			t.Recv += int64(c.sock.recv.Load())
			t.Rebinds += c.sock.rebinds.Load()
		}
	}
	return t
}

// Lost is the number of records (a message or its echo) that never came
// back, once the clients were stopped and drained.
func (t soakTally) Lost() int64 { return t.Writes - t.Echoes }

func soakCloseAll(cs ...[]*soakClient) {
	for _, list := range cs {
		for _, c := range list {
			if c.conn != nil {
				c.close()
			}
		}
	}
}

// soakMem is the process's goroutines and live heap.
type soakMem struct {
	Goroutines int
	Heap       uint64
}

func soakMeasure() soakMem {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return soakMem{Goroutines: runtime.NumGoroutine(), Heap: ms.HeapAlloc}
}

// soakHeapSlack is how much more live heap (after GC) a scenario may leave
// behind than it found: pools, pion's and quic-go's lazily built tables
// and the race detector's shadow bookkeeping, not per-datagram or
// per-client state (a leak of that kind grows with the load, and the long
// soak's figures show it would exceed this).
const soakHeapSlack = 8 << 20

// soakSettle waits (up to 15 s: a backend's half-open handshakes end
// after its 2 s handshake timeout) until no more goroutines run than
// before, then asserts it and the heap bound.
func soakSettle(t *testing.T, before soakMem) soakMem {
	t.Helper()
	var after soakMem
	deadline := time.Now().Add(15 * time.Second)
	for {
		after = soakMeasure()
		if after.Goroutines <= before.Goroutines || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if after.Goroutines > before.Goroutines {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Logf("goroutines:\n%s", buf[:n])
	}
	if p := os.Getenv("SOAK_HEAPPROF"); p != "" {
		f, _ := os.Create(p + "." + strings.ReplaceAll(t.Name(), "/", "_"))
		pprof.WriteHeapProfile(f)
		f.Close()
	}
	require.LessOrEqual(t, after.Goroutines, before.Goroutines, "goroutines left behind")
	require.LessOrEqual(t, after.Heap, before.Heap+soakHeapSlack, "live heap grew by more than %d MiB", soakHeapSlack>>20)
	return after
}

// soakSockDrops sums the kernel's per-socket drop counts (the last column
// of /proc/net/udp and udp6: datagrams that found the receive buffer
// full) over the sockets bound to the given ports. The sockets of one
// SO_REUSEPORT group share a port and are all counted.
func soakSockDrops(ports map[uint16]bool) uint64 {
	var n uint64
	for _, name := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 13 || fields[0] == "sl" {
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			port, err := strconv.ParseUint(hexPort, 16, 16)
			if err != nil || !ports[uint16(port)] {
				continue
			}
			d, _ := strconv.ParseUint(fields[len(fields)-1], 10, 64)
			n += d
		}
		f.Close()
	}
	return n
}

// soakSleep pauses for d unless the test is ending.
func soakSleep(t *testing.T, d time.Duration) {
	select {
	case <-time.After(d):
	case <-t.Context().Done():
	}
}
