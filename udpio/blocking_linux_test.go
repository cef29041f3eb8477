//go:build linux

package udpio

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBlockingReadAndShutdown: a blocking Conn waits in the kernel, one
// recvmmsg per batch; Shutdown wakes it, the datagrams already queued are
// delivered first, then ReadBatch reports net.ErrClosed. A real 0-byte
// datagram is a datagram, not the end.
func TestBlockingReadAndShutdown(t *testing.T) {
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r, s := newConn(t, rc, 8), newConn(t, sc, 8)
	require.NoError(t, r.SetBlocking())
	real := r.rx.fn
	calls := 0
	r.rx.fn = func(fd uintptr) bool { calls++; return real(fd) }

	// One locked reader; each request is one ReadBatch.
	type result struct {
		sizes []int
		err   error
	}
	req, got := make(chan struct{}), make(chan result)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ms := make([]Message, 8)
		for i := range ms {
			ms[i].Buf = make([]byte, 64)
		}
		for range req {
			n, err := r.ReadBatch(ms)
			res := result{err: err}
			for _, m := range ms[:n] {
				res.sizes = append(res.sizes, m.N)
			}
			got <- res
		}
	}()
	t.Cleanup(func() { close(req) })
	read := func() result { req <- struct{}{}; return <-got }
	send := func(sizes ...int) {
		var out []Message
		for _, n := range sizes {
			out = append(out, Message{Buf: make([]byte, n), Addr: addrOf(rc)})
		}
		k, err := s.WriteBatch(out)
		require.NoError(t, err)
		require.Equal(t, len(sizes), k)
	}

	// The reader waits in the kernel: one recvmmsg for the wake-up, where
	// the netpoller makes two (the would-block, then the read).
	req <- struct{}{}
	select {
	case res := <-got:
		t.Fatalf("ReadBatch returned without a datagram: %+v", res)
	case <-time.After(50 * time.Millisecond):
	}
	send(0)
	res := <-got
	require.NoError(t, res.err)
	assert.Equal(t, []int{0}, res.sizes, "a 0-byte datagram is delivered as one")
	assert.Equal(t, 1, calls, "recvmmsg calls for one wake-up")

	send(5, 6, 7)
	var all []int
	for len(all) < 3 {
		res = read()
		require.NoError(t, res.err)
		all = append(all, res.sizes...)
	}
	assert.Equal(t, []int{5, 6, 7}, all)

	// Queued datagrams survive a shutdown; then the reader ends.
	send(9, 10)
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	require.NoError(t, r.Shutdown())
	var after []int
	for {
		res = read()
		after = append(after, res.sizes...)
		if res.err != nil {
			break
		}
	}
	assert.ErrorIs(t, res.err, net.ErrClosed)
	assert.Equal(t, []int{9, 10}, after, "queued datagrams are delivered before the end")
	assert.Less(t, time.Since(start), 2*time.Second)
	res = read()
	assert.ErrorIs(t, res.err, net.ErrClosed, "and stays ended")

	// Sending is unaffected by the receive shutdown.
	k, err := r.WriteBatch([]Message{{Buf: []byte("still"), Addr: addrOf(sc)}})
	require.NoError(t, err)
	assert.Equal(t, 1, k)
}

// TestShutdownWakesBlockedReader: without a shutdown, closing a blocking
// socket's UDPConn would wait for the reader in the kernel; Shutdown is
// what ends it, promptly, on an idle socket too.
func TestShutdownWakesBlockedReader(t *testing.T) {
	rc := listen(t, "udp6", "[::1]:0", ListenConfig{PacketInfo: true})
	r := newConn(t, rc, 4)
	require.NoError(t, r.SetBlocking())
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, err := r.ReadBatch([]Message{{Buf: make([]byte, 10)}})
		done <- err
	}()
	time.Sleep(30 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("returned before the shutdown: %v", err)
	default:
	}
	require.NoError(t, r.Shutdown())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(2 * time.Second):
		t.Fatal("Shutdown did not wake the reader")
	}
	require.NoError(t, r.Close(), "the Conn owns the socket now")
}

// TestBlockingLeavesNetpoller: a blocking Conn's socket is in no epoll
// set of the process (the runtime's would wake a thread for every
// datagram beside the blocked reader), and its UDPConn is closed.
func TestBlockingLeavesNetpoller(t *testing.T) {
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r := newConn(t, rc, 4)
	before := fdOf(t, r)
	require.Contains(t, polled(t), before, "a UDPConn is in the runtime's epoll set")
	require.NoError(t, r.SetBlocking())
	t.Cleanup(func() { r.Close() })
	after := fdOf(t, r)
	assert.NotEqual(t, before, after)
	assert.NotContains(t, polled(t), after, "the blocking socket is polled by no epoll set")
	assert.NotContains(t, polled(t), before)
	assert.ErrorIs(t, rc.SetReadDeadline(time.Time{}), net.ErrClosed, "the UDPConn is closed")
	assert.Equal(t, addrOf(rc).Port(), localPort(t, r), "the Conn holds the same socket")
}

func fdOf(t *testing.T, c syscall.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	var n int
	require.NoError(t, raw.Control(func(fd uintptr) { n = int(fd) }))
	return n
}

func localPort(t *testing.T, c syscall.Conn) uint16 {
	t.Helper()
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	var sa unix.Sockaddr
	var serr error
	require.NoError(t, raw.Control(func(fd uintptr) { sa, serr = unix.Getsockname(int(fd)) }))
	require.NoError(t, serr)
	return uint16(sa.(*unix.SockaddrInet4).Port)
}

// polled returns the descriptors that the process's epoll sets watch,
// from /proc/self/fdinfo.
func polled(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var out []int
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || l != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			var tfd int
			if _, err := fmt.Sscanf(line, "tfd: %d", &tfd); err == nil {
				out = append(out, tfd)
			}
		}
	}
	return out
}

// TestKernelDrops: datagrams the kernel drops on a full receive buffer
// are counted, and with what the reader gets they add up to what was
// sent (loopback loses nothing else).
func TestKernelDrops(t *testing.T) {
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{RecvBuffer: 4096})
	d0, err := KernelDrops(rc)
	require.NoError(t, err)
	require.Zero(t, d0)
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	const sent = 300
	for i := range sent {
		_, err := sc.WriteToUDPAddrPort(seqMsg(uint32(i), 500), addrOf(rc))
		require.NoError(t, err)
	}
	drops, err := KernelDrops(rc)
	require.NoError(t, err)
	require.NotZero(t, drops, "a 4 KiB buffer cannot hold 300 datagrams of 500 bytes")
	r := newConn(t, rc, 32)
	got := readAll(t, r, rc, sent-int(drops))
	assert.Len(t, got, sent-int(drops))
	// Nothing more is queued.
	require.NoError(t, rc.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	n, _ := r.ReadBatch([]Message{{Buf: make([]byte, 600)}})
	assert.Zero(t, n)
	t.Logf("sent %d, received %d, kernel drops %d", sent, len(got), drops)
}
