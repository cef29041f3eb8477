// Command rawfwd is the raw-limit baseline of the forwarding benchmark:
// the least work a PPv2 forwarder can do on this kernel. Forward, it reads
// a batch with recvmmsg, puts a fixed 28-byte PROXY v2 IPv4 header in
// front of each datagram as a second iovec (the client's address written
// in, nothing parsed or looked up) and sends the batch to the one backend
// with sendmmsg. Reverse, it takes the client's address from fixed offsets
// of the backend's 28-byte header and sends the rest back from the
// service socket. No checks beyond the header's length: it is a
// measuring stick, not a proxy.
//
// It prints "rawfwd listening on ADDR" once bound, and stops on SIGINT or
// SIGTERM.
//
//	rawfwd -listen 127.0.0.1:5684 -backend 127.0.0.1:7000
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/udpio"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cmd(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func cmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rawfwd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "service `ip:port` (IPv4)")
	backend := fs.String("backend", "", "backend `ip:port` (IPv4), required")
	batch := fs.Int("batch", udpio.DefaultBatch, "datagrams per recvmmsg/sendmmsg")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	be, err := netip.ParseAddrPort(*backend)
	if err != nil || !be.Addr().Is4() {
		fmt.Fprintf(stderr, "rawfwd: -backend %q: want an IPv4 ip:port\n", *backend)
		return 2
	}
	f, err := newForwarder(*listen, be, *batch)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "rawfwd listening on %s\n", f.svc.LocalAddr())
	f.run(ctx)
	return 0
}

// hdrLen is a PROXY v2 header for IPv4 over DGRAM: signature(12), ver/cmd,
// fam/proto, length(2) = 12, src(4) dst(4) sport(2) dport(2).
const hdrLen = 28

type forwarder struct {
	svc, up     *net.UDPConn
	svcIO, upIO *udpio.Conn
	backend     netip.AddrPort

	fwdIn, fwdOut, revIn, revOut []udpio.Message
	hdrs                         []byte
}

func newForwarder(listen string, backend netip.AddrPort, batch int) (*forwarder, error) {
	svcG, err := udpio.ListenGroup("udp4", listen, 1, udpio.ListenConfig{})
	if err != nil {
		return nil, err
	}
	upG, err := udpio.ListenGroup("udp4", "0.0.0.0:0", 1, udpio.ListenConfig{})
	if err != nil {
		svcG[0].Close()
		return nil, err
	}
	f := &forwarder{svc: svcG[0], up: upG[0], backend: backend}
	if f.svcIO, err = udpio.NewConn(f.svc, batch); err == nil {
		f.upIO, err = udpio.NewConn(f.up, batch)
	}
	if err != nil {
		f.svc.Close()
		f.up.Close()
		return nil, err
	}
	if batch == 0 {
		batch = udpio.DefaultBatch
	}
	service := f.svc.LocalAddr().(*net.UDPAddr).AddrPort()
	f.fwdIn, f.revIn = buffers(batch), buffers(batch)
	f.fwdOut, f.revOut = make([]udpio.Message, batch), make([]udpio.Message, batch)
	f.hdrs = make([]byte, batch*hdrLen)
	for i := range f.fwdOut {
		h := f.hdrs[i*hdrLen : (i+1)*hdrLen : (i+1)*hdrLen]
		copy(h, "\r\n\r\n\x00\r\nQUIT\n\x21\x12\x00\x0c")
		ip := service.Addr().As4()
		copy(h[20:24], ip[:])
		binary.BigEndian.PutUint16(h[26:], service.Port())
		f.fwdOut[i].Prefix = h
	}
	return f, nil
}

func buffers(n int) []udpio.Message {
	const size = 9216
	ms := make([]udpio.Message, n)
	slab := make([]byte, n*size)
	for i := range ms {
		ms[i].Buf = slab[i*size : (i+1)*size : (i+1)*size]
	}
	return ms
}

func (f *forwarder) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(f.forward)
	wg.Go(f.reverse)
	<-ctx.Done()
	f.svc.SetReadDeadline(time.Unix(1, 0))
	f.up.SetReadDeadline(time.Unix(1, 0))
	wg.Wait()
	f.svc.Close()
	f.up.Close()
}

func (f *forwarder) forward() {
	for {
		n, err := f.svcIO.ReadBatch(f.fwdIn)
		if err != nil {
			return
		}
		for i := range f.fwdIn[:n] {
			in, out := &f.fwdIn[i], &f.fwdOut[i]
			stampClient(out.Prefix, in.Addr)
			out.Buf, out.Addr = in.Buf[:in.N], f.backend
		}
		if _, err := f.upIO.WriteBatch(f.fwdOut[:n]); err != nil {
			return
		}
	}
}

// stampClient writes the client's IPv4 address and port into a header.
func stampClient(h []byte, client netip.AddrPort) {
	ip := client.Addr().As4() // an IPv4 socket reports IPv4 peers
	copy(h[16:20], ip[:])
	binary.BigEndian.PutUint16(h[24:], client.Port())
}

func (f *forwarder) reverse() {
	for {
		n, err := f.upIO.ReadBatch(f.revIn)
		if err != nil {
			return
		}
		k := 0
		for i := range f.revIn[:n] {
			in := &f.revIn[i]
			if in.N < hdrLen {
				continue
			}
			b := in.Buf[:in.N]
			f.revOut[k] = udpio.Message{Buf: b[hdrLen:], Addr: clientOf(b)}
			k++
		}
		if _, err := f.svcIO.WriteBatch(f.revOut[:k]); err != nil {
			return
		}
	}
}

// clientOf reads the destination of a reply's header: the client.
func clientOf(b []byte) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[20:24])), binary.BigEndian.Uint16(b[26:28]))
}
