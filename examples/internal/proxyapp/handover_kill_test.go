//go:build linux

package proxyapp

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
)

// The kill-point table (issue 35): either side of a handover killed at
// every step of the protocol, by SIGKILL and by SIGTERM, with a client
// streaming through the port. Afterwards exactly one process serves (the
// other side: the victim has exited, every datagram of a fresh burst is
// answered, and the survivor takes a successor's connection), and the
// loss is bounded.
//
// The processes are this test binary run again (TestHandoverChild), whose
// handoverStep hook writes each step to its log and, at the step named in
// its environment, waits there: until SIGTERM (then it goes on as the
// program does when told to stop at that step), SIGUSR1 (the test lets it
// go on), or SIGKILL. A kill point is one side waiting at a step, the
// other waiting for its next message: the test kills either.
//
//	go test -run TestHandoverKill -v ./examples/internal/proxyapp/

const (
	hoChildArgs  = "CIDPROXY_TEST_HANDOVER_ARGS"  // the child's arguments, JSON
	hoChildPause = "CIDPROXY_TEST_HANDOVER_PAUSE" // side/step where it waits
)

// TestHandoverChild is no test of its own: it is the cidproxy process of
// the tests that start real processes (hoChild).
func TestHandoverChild(t *testing.T) {
	raw := os.Getenv(hoChildArgs)
	if raw == "" {
		t.Skip("the process that TestHandoverKill starts")
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	pause := os.Getenv(hoChildPause)
	release := make(chan os.Signal, 1)
	signal.Notify(release, syscall.SIGUSR1)
	handoverStep = func(ctx context.Context, side, step string) {
		fmt.Fprintf(os.Stderr, "handover-step %s %s\n", side, step)
		if side+"/"+step == pause {
			fmt.Fprintf(os.Stderr, "handover-paused %s %s\n", side, step)
			select {
			case <-ctx.Done():
			case <-release:
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := Run(ctx, args, os.Stdout, os.Stderr, Options{})
	stop()
	os.Exit(code)
}

// A hoChild is one cidproxy process of the test.
type hoChild struct {
	name   string
	cmd    *exec.Cmd
	logs   syncBuffer
	exited chan error
}

func startHoChild(t *testing.T, name, pause string, args ...string) *hoChild {
	t.Helper()
	raw, err := json.Marshal(args)
	require.NoError(t, err)
	c := &hoChild{name: name, exited: make(chan error, 1),
		cmd: exec.Command(os.Args[0], "-test.run=^TestHandoverChild$", "-test.count=1")}
	c.cmd.Env = append(os.Environ(), hoChildArgs+"="+string(raw), hoChildPause+"="+pause)
	c.cmd.Stderr = &c.logs
	require.NoError(t, c.cmd.Start())
	go func() { c.exited <- c.cmd.Wait() }()
	t.Cleanup(func() {
		if c.running() {
			c.cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", c.name, c.logs.String())
		}
	})
	return c
}

func (c *hoChild) running() bool {
	select {
	case err := <-c.exited:
		c.exited <- err
		return false
	default:
		return true
	}
}

func (c *hoChild) waitLog(t *testing.T, what string, within time.Duration) {
	t.Helper()
	waitFor(t, within, c.name+": "+what, func() bool {
		if !c.running() {
			t.Fatalf("%s exited before %q", c.name, what)
		}
		return strings.Contains(c.logs.String(), what)
	})
}

func (c *hoChild) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-c.exited:
		c.exited <- err
		return err
	case <-time.After(within):
		t.Fatalf("%s did not exit within %v", c.name, within)
		return nil
	}
}

// A hoFlow streams CID records to a service at a steady rate until
// stopped, and counts what it sent and the echoes.
type hoFlow struct {
	conn         *net.UDPConn
	sent, echoes atomic.Int64
	stop         chan struct{}
	done         sync.WaitGroup
}

func startFlow(t *testing.T, addr netip.AddrPort, rate int) *hoFlow {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	require.NoError(t, c.SetReadBuffer(4<<20))
	f := &hoFlow{conn: c, stop: make(chan struct{})}
	t.Cleanup(func() { f.halt(); c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			f.echoes.Add(1)
		}
	}()
	f.done.Add(1)
	go func() {
		defer f.done.Done()
		codec := dtls.OrdinalFirst{Length: cidroute.DefaultDTLSCIDLen}
		start := time.Now()
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				return
			default:
			}
			cid, _ := codec.AppendCID(nil, uint8(i%3))
			rec, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: uint64(i), CID: cid, Fragment: []byte("payload")})
			c.WriteToUDPAddrPort(rec, addr)
			f.sent.Add(1)
			if ahead := time.Duration(i+1)*time.Second/time.Duration(rate) - time.Since(start); ahead > time.Millisecond {
				time.Sleep(ahead)
			}
		}
	}()
	return f
}

func (f *hoFlow) halt() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.done.Wait()
}

// settle stops the flow and waits until the echoes stand still (or are
// all in); it returns what was sent and lost.
func (f *hoFlow) settle() (sent, lost int64) {
	f.halt()
	last, still := int64(-1), 0
	for still < 5 && f.echoes.Load() < f.sent.Load() {
		time.Sleep(100 * time.Millisecond)
		if n := f.echoes.Load(); n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	return f.sent.Load(), f.sent.Load() - f.echoes.Load()
}

// The protocol's steps where a side waits for the other, in order
// (handover.go).
var (
	hoPredecessorSteps = []string{"hello-received", "sockets-sent", "ready-received", "drained", "done-sent"}
	hoSuccessorSteps   = []string{"hello-sent", "sockets-received", "serving", "ready-sent", "done-received"}
)

// hoOtherWaits is where the other side waits while one waits at a step:
// for that one's next message. With the predecessor at done-sent, the
// successor has sent bye: its part is over, and its death is a crash
// after the handover, as after any start.
func hoOtherWaits(side, step string) string {
	switch side + "/" + step {
	case "predecessor/hello-received":
		return "hello-sent"
	case "predecessor/sockets-sent", "predecessor/ready-received", "predecessor/drained":
		return "ready-sent"
	case "predecessor/done-sent":
		return ""
	case "successor/hello-sent", "successor/sockets-received", "successor/serving":
		return "sockets-sent"
	default: // successor/ready-sent, successor/done-received
		return "done-sent"
	}
}

// hoKillRate is the client's rate, datagrams a second.
const hoKillRate = 2000

// hoKillRow is one row of the kill-point table.
type hoKillRow struct {
	oldAt, newAt, victim, signal, serves string
	sent, lost                           int64
}

func TestHandoverKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 76 processes")
	}
	var rows []hoKillRow
	for _, side := range []string{"predecessor", "successor"} {
		steps := hoPredecessorSteps
		if side == "successor" {
			steps = hoSuccessorSteps
		}
		for _, step := range steps {
			for _, victim := range []string{"predecessor", "successor"} {
				if victim != side && hoOtherWaits(side, step) == "" {
					continue
				}
				for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
					name := fmt.Sprintf("%s-at-%s/kill-%s/%s", side, step, victim, strings.TrimPrefix(sig.String(), "signal "))
					t.Run(name, func(t *testing.T) {
						rows = append(rows, handoverKill(t, side, step, victim, sig))
					})
				}
			}
		}
	}
	t.Logf("kill point × signal → the process serving after, datagrams sent and lost at %d/s:", hoKillRate)
	t.Logf("| old at | new at | killed | signal | serves after | sent | lost |")
	t.Logf("|---|---|---|---|---|---|---|")
	for _, r := range rows {
		t.Logf("| %s | %s | %s | %s | %s | %d | %d |", r.oldAt, r.newAt, r.victim, r.signal, r.serves, r.sent, r.lost)
	}
}

// handoverKill runs one kill point: the old process serves a flow, a new
// one takes over; side waits at step, the other side for its next
// message, and victim gets sig.
func handoverKill(t *testing.T, side, step, victimSide string, sig syscall.Signal) hoKillRow {
	e := newHoEnv(t)
	args := []string{"-handover", e.sock, "-config", e.path}
	pauseOld, pauseNew := "", ""
	oldAt, newAt := step, hoOtherWaits(side, step)
	if newAt == "" {
		newAt = "(bye sent)"
	}
	if side == "predecessor" {
		pauseOld = side + "/" + step
	} else {
		pauseNew = side + "/" + step
		oldAt, newAt = newAt, step
	}
	old := startHoChild(t, "old", pauseOld, args...)
	old.waitLog(t, "handover socket listening", 15*time.Second)
	f := startFlow(t, e.svc, hoKillRate)
	time.Sleep(200 * time.Millisecond)
	nw := startHoChild(t, "new", pauseNew, args...)
	paused, other := old, nw
	if side == "successor" {
		paused, other = nw, old
	}
	paused.waitLog(t, "handover-paused "+side+" "+step, 15*time.Second)
	otherSide := map[string]string{"predecessor": "successor", "successor": "predecessor"}[side]
	other.waitLog(t, "handover-step "+otherSide+" "+hoOtherWaits(side, step), 15*time.Second)
	time.Sleep(100 * time.Millisecond) // traffic while they wait there
	victim, survivor := old, nw
	if victimSide == "successor" {
		victim, survivor = nw, old
	}
	require.NoError(t, victim.cmd.Process.Signal(sig))
	err := victim.wait(t, 10*time.Second)
	if sig == syscall.SIGTERM {
		assert.NoError(t, err, "told to stop, the victim exits 0")
	}
	if victim != paused {
		require.NoError(t, paused.cmd.Process.Signal(syscall.SIGUSR1)) // it goes on
	}
	time.Sleep(300 * time.Millisecond) // traffic after
	sent, lost := f.settle()
	require.True(t, survivor.running(), "the survivor still runs")

	// It serves: a fresh burst is answered in full.
	burst := startFlow(t, e.svc, 1000)
	time.Sleep(200 * time.Millisecond)
	bs, bl := burst.settle()
	assert.Zero(t, bl, "the survivor answers every datagram of a burst of %d", bs)
	// And it can be replaced in turn: its handover socket takes a successor.
	c, err := dialHandover(e.sock)
	require.NoError(t, err)
	require.NotNil(t, c, "the survivor listens on the handover socket")
	c.Close()

	how := survivor.name + ": serves on"
	switch l := survivor.logs.String(); {
	case strings.Contains(l, "serving again after the successor vanished"):
		how = "old: serves again (kept sockets)"
	case strings.Contains(l, "starting afresh"):
		how = "new: binds afresh"
	case survivor == nw:
		how = "new: serves alone"
	}
	t.Logf("old at %s, new at %s, %s %v: %s; sent %d, lost %d", oldAt, newAt, victimSide, sig, how, sent, lost)
	assert.LessOrEqual(t, lost, hoKillLossBound(oldAt, victimSide, sig), "loss")
	require.NoError(t, survivor.cmd.Process.Signal(syscall.SIGTERM))
	assert.NoError(t, survivor.wait(t, 10*time.Second))
	return hoKillRow{oldAt, newAt, victimSide, strings.TrimPrefix(sig.String(), "signal "), how, sent, lost}
}

// hoKillLossBound is the most a kill may lose. SIGTERM loses nothing:
// the victim sends what it read. SIGKILL loses what the victim had read
// and not sent, at most a batch per worker socket (2 workers, listen and
// upstream, 64 a batch); a predecessor killed before it passed its
// sockets takes their queues with it and the successor binds anew: the
// client's datagrams until then are lost too (bounded by a second at the
// client's rate).
func hoKillLossBound(oldAt, victim string, sig syscall.Signal) int64 {
	switch {
	case sig == syscall.SIGTERM:
		return 0
	case victim == "predecessor" && oldAt == "hello-received":
		return hoKillRate
	default:
		return 2 * 2 * cidroute.DefaultBatchSize
	}
}

const hoSquatter = "CIDPROXY_TEST_HANDOVER_SQUATTER" // listen PATH ADDR, or dial PATH

// TestHandoverSquatterChild is no test of its own: it is the other user's
// process of TestHandoverPeerOtherUser. "listen" hands whoever connects a
// UDP socket of its own as the listen socket of ADDR, with every backend
// marked down; "dial" asks for the sockets and says whether it got any.
func TestHandoverSquatterChild(t *testing.T) {
	spec := strings.Fields(os.Getenv(hoSquatter))
	if len(spec) == 0 {
		t.Skip("the process that TestHandoverPeerOtherUser starts")
	}
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	switch spec[0] {
	case "listen":
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: spec[1], Net: "unixpacket"})
		if err != nil {
			fail(err)
		}
		fmt.Println("listening")
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				fail(err)
			}
			u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				fail(err)
			}
			recvHandover(c, time.Now().Add(5*time.Second))
			m := hoMsg{Type: "sockets", PID: os.Getpid(), Version: "squatter",
				Sockets: []hoSocket{{Role: "listen", Listen: spec[2]}}}
			sendHandover(c, m, []syscall.Conn{u}, time.Now().Add(5*time.Second))
		}
	case "dial":
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: spec[1], Net: "unixpacket"})
		if err != nil {
			fail(err)
		}
		if err := sendHandover(c, hoMsg{Type: "hello", PID: os.Getpid(), Version: "squatter"}, nil, time.Now().Add(5*time.Second)); err != nil {
			fmt.Println("refused:", err)
			os.Exit(0)
		}
		m, files, err := recvHandover(c, time.Now().Add(5*time.Second))
		if err != nil {
			fmt.Println("refused:", err)
			os.Exit(0)
		}
		fmt.Printf("got %s with %d descriptors\n", m.Type, len(files))
		os.Exit(3)
	}
	os.Exit(2)
}

// squatter runs TestHandoverSquatterChild as uid 65534 (nobody), from a
// copy of the test binary that user can run.
func squatter(t *testing.T, spec string) *exec.Cmd {
	t.Helper()
	dir, err := os.MkdirTemp("", "cidproxy-squatter-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "test")
	b, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	cmd := exec.Command(bin, "-test.run=^TestHandoverSquatterChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), hoSquatter+"="+spec)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Dir = dir
	return cmd
}

// TestHandoverPeerOtherUser: each side of a handover refuses a peer of
// another user (SO_PEERCRED). A successor started by root does not take
// the sockets of another user's process listening on its handover path
// (there by a rename: its directory is root's), nor does a predecessor
// give its sockets to another user's process, even with the socket
// file's mode opened.
func TestHandoverPeerOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a process as another user (uid 65534)")
	}
	t.Run("successor", func(t *testing.T) {
		e := newHoEnv(t)
		sqDir, err := os.MkdirTemp("", "cidproxy-squat-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(sqDir) })
		require.NoError(t, os.Chown(sqDir, 65534, 65534))
		sqPath := filepath.Join(sqDir, "s.sock")
		cmd := squatter(t, "listen "+sqPath+" "+e.svc.String())
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitFor(t, 10*time.Second, "the squatter listening", func() bool { return strings.Contains(out.String(), "listening") })
		require.NoError(t, os.Rename(sqPath, e.sock))

		c, err := dialHandover(e.sock)
		require.ErrorIs(t, err, errHandoverPeer)
		require.Nil(t, c)
		assert.Contains(t, err.Error(), "uid 65534")

		r := e.start(t, Options{}, "-handover", e.sock)
		require.Equal(t, 1, r.exited(t), "refused")
		assert.Contains(t, r.logs.String(), "another user's process")
		assert.NotContains(t, r.logs.String(), "handover: taking over")
	})
	t.Run("predecessor", func(t *testing.T) {
		e := newHoEnv(t)
		r := e.start(t, Options{}, "-handover", e.sock)
		r.wait(t, "handover socket listening")
		require.NoError(t, os.Chmod(filepath.Dir(e.dir), 0o755)) // for uid 65534 to reach it
		require.NoError(t, os.Chmod(e.dir, 0o755))
		require.NoError(t, os.Chmod(e.sock, 0o777)) // as if someone had
		cmd := squatter(t, "dial "+e.sock)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Contains(t, string(out), "refused:")
		r.wait(t, "handover socket: connection refused")
		assert.Contains(t, r.logs.String(), "uid 65534")
		assert.NotContains(t, r.logs.String(), "a successor asks for the sockets")
		s := stream(t, e.svc, 100, 1000)
		<-s.done
		waitFor(t, 5*time.Second, "echoes", func() bool { return s.echoes.Load() == 100 })
	})
}
