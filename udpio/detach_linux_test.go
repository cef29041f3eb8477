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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestDetachedReadsAndPoller: a detached Conn never waits in ReadBatch
// (ErrWouldBlock); a Poller wakes its thread once per wake-up, for the
// Conn that has datagrams, and a 0-byte datagram is a datagram.
func TestDetachedReadsAndPoller(t *testing.T) {
	ac := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	bc := listen(t, "udp6", "[::1]:0", ListenConfig{PacketInfo: true})
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	s6 := listen(t, "udp6", "[::1]:0", ListenConfig{})
	a, b := newConn(t, ac, 8), newConn(t, bc, 8)
	aAddr, bAddr := addrOf(ac), addrOf(bc)
	require.NoError(t, a.Detach())
	require.NoError(t, b.Detach())
	t.Cleanup(func() { a.Close(); b.Close() })
	p, err := NewPoller(a, b)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })

	ms := make([]Message, 8)
	for i := range ms {
		ms[i].Buf = make([]byte, 64)
	}
	n, err := a.ReadBatch(ms)
	require.ErrorIs(t, err, ErrWouldBlock, "nothing queued: no wait")
	require.Zero(t, n)

	type result struct {
		woken bool
		ready []bool
		err   error
	}
	waits := make(chan result)
	wait := func() {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			ready := make([]bool, 2)
			woken, err := p.Wait(ready)
			waits <- result{woken, ready, err}
		}()
	}
	wait()
	select {
	case r := <-waits:
		t.Fatalf("Wait returned with nothing queued: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	_, err = sc.WriteToUDPAddrPort(nil, aAddr)
	require.NoError(t, err)
	r := <-waits
	require.NoError(t, r.err)
	assert.False(t, r.woken)
	assert.Equal(t, []bool{true, false}, r.ready)
	n, err = a.ReadBatch(ms)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Zero(t, ms[0].N, "a 0-byte datagram")
	assert.Equal(t, addrOf(sc), ms[0].Addr)

	// The other Conn, with packet info, through the same Poller.
	for range 3 {
		_, err = s6.WriteToUDPAddrPort([]byte("six"), bAddr)
		require.NoError(t, err)
	}
	time.Sleep(20 * time.Millisecond)
	wait()
	r = <-waits
	assert.Equal(t, []bool{false, true}, r.ready)
	n, err = b.ReadBatch(ms)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Equal(t, "six", string(ms[2].Buf[:ms[2].N]))
	assert.Equal(t, bAddr.Addr(), ms[0].Local)
	_, err = b.ReadBatch(ms)
	require.ErrorIs(t, err, ErrWouldBlock)

	// A detached Conn sends.
	k, err := a.WriteBatch([]Message{{Prefix: []byte("hdr|"), Buf: []byte("body"), Addr: addrOf(sc)}})
	require.NoError(t, err)
	require.Equal(t, 1, k)
	buf := make([]byte, 64)
	require.NoError(t, sc.SetReadDeadline(time.Now().Add(2*time.Second)))
	got, from, err := sc.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	assert.Equal(t, "hdr|body", string(buf[:got]))
	assert.Equal(t, aAddr, from)

	// Wake ends a blocked Wait, and every later one.
	wait()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, p.Wake())
	select {
	case r = <-waits:
		assert.True(t, r.woken)
	case <-time.After(2 * time.Second):
		t.Fatal("Wake did not end the wait")
	}
	woken, err := p.Wait(make([]bool, 2))
	require.NoError(t, err)
	assert.True(t, woken, "and stays woken")
}

// TestDetachLeavesNetpoller: a detached Conn's socket is in no epoll set
// of the runtime (whose waiting thread would wake for every datagram
// beside the Poller's), its UDPConn is closed, and its file status is
// untouched: another process sharing the socket (a handover's successor)
// is not affected.
func TestDetachLeavesNetpoller(t *testing.T) {
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r := newConn(t, rc, 4)
	before := fdOf(t, r)
	require.Contains(t, polled(t), before, "a UDPConn is in the runtime's epoll set")
	flags := func() int {
		raw, err := r.SyscallConn()
		require.NoError(t, err)
		var fl int
		require.NoError(t, raw.Control(func(fd uintptr) { fl, err = unix.FcntlInt(fd, unix.F_GETFL, 0) }))
		require.NoError(t, err)
		return fl
	}
	fl := flags()
	require.NoError(t, r.Detach())
	after := fdOf(t, r)
	assert.NotEqual(t, before, after)
	assert.NotContains(t, polled(t), after, "the detached socket is polled by no epoll set")
	assert.NotContains(t, polled(t), before)
	assert.ErrorIs(t, rc.SetReadDeadline(time.Time{}), net.ErrClosed, "the UDPConn is closed")
	assert.Equal(t, addrOf(rc).Port(), localPort(t, r), "the Conn holds the same socket")
	assert.Equal(t, fl, flags(), "file status flags (O_NONBLOCK) unchanged")

	require.NoError(t, r.Close())
	raw, _ := r.SyscallConn()
	assert.ErrorIs(t, raw.Control(func(uintptr) {}), net.ErrClosed, "a closed descriptor is not used again")
	_, err := KernelDrops(r)
	assert.Error(t, err)
	assert.ErrorIs(t, r.Close(), net.ErrClosed)
}

// TestDetachedReadsAfterBlockingPeer: another process may set the shared
// socket blocking (a build that waits in recvmmsg); the detached Conn
// still never waits (MSG_DONTWAIT).
func TestDetachedReadsAfterBlockingPeer(t *testing.T) {
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r := newConn(t, rc, 4)
	require.NoError(t, r.Detach())
	t.Cleanup(func() { r.Close() })
	raw, _ := r.SyscallConn()
	require.NoError(t, raw.Control(func(fd uintptr) { require.NoError(t, unix.SetNonblock(int(fd), false)) }))
	done := make(chan error, 1)
	go func() {
		_, err := r.ReadBatch([]Message{{Buf: make([]byte, 8)}})
		done <- err
	}()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrWouldBlock)
	case <-time.After(2 * time.Second):
		t.Fatal("ReadBatch waited on a blocking descriptor")
	}
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
