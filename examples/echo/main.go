// Command echo is the benchmark backend: it returns every datagram to its
// sender in recvmmsg/sendmmsg batches. With -proxy-protocol (the default)
// it strips the PROXY protocol v2 header a proxy put in front and answers
// through that proxy with the reverse header (source = service,
// destination = client), as the header and the payload in two iovecs of
// one datagram; without it, it echoes datagrams unchanged, for forwarders
// that keep one upstream socket per client (transparent proxies, nginx).
//
// It prints "echo listening on ADDR" once its sockets are bound, and
// serves until SIGINT or SIGTERM. The per-datagram path does not allocate.
//
//	echo -listen 127.0.0.1:7000 -proxy-protocol=false
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/udpio"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cmd(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// cmd is main without the process, for tests.
func cmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("echo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "UDP `ip:port` to serve")
	pp := fs.Bool("proxy-protocol", true, "strip the PPv2 header and reply with the reverse one")
	batch := fs.Int("batch", udpio.DefaultBatch, "datagrams per recvmmsg/sendmmsg")
	sockets := fs.Int("sockets", 1, "SO_REUSEPORT sockets, one goroutine each")
	rcvbuf := fs.Int("rcvbuf", 8<<20, "SO_RCVBUF/SO_SNDBUF in bytes")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	group, err := udpio.ListenGroup("udp", *listen, *sockets, udpio.ListenConfig{RecvBuffer: *rcvbuf, SendBuffer: *rcvbuf})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	var echoers []*echoer
	for _, c := range group {
		e, err := newEchoer(c, *batch, *pp)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		echoers = append(echoers, e)
	}
	fmt.Fprintf(stdout, "echo listening on %s\n", group[0].LocalAddr())
	var wg sync.WaitGroup
	for _, e := range echoers {
		wg.Go(func() {
			if err := e.serve(); err != nil {
				fmt.Fprintln(stderr, err)
			}
		})
	}
	<-ctx.Done()
	for _, c := range group {
		c.SetReadDeadline(time.Unix(1, 0))
	}
	wg.Wait()
	for _, c := range group {
		c.Close()
	}
	return 0
}

// An echoer serves one socket; its batch state is allocated once.
type echoer struct {
	conn    *net.UDPConn
	io      *udpio.Conn
	pp      bool
	in, out []udpio.Message
}

// headerRoom is the reverse header's buffer: PPv2 over IPv6 is 52 bytes.
const headerRoom = 64

func newEchoer(c *net.UDPConn, batch int, pp bool) (*echoer, error) {
	io, err := udpio.NewConn(c, batch)
	if err != nil {
		return nil, err
	}
	if batch == 0 {
		batch = udpio.DefaultBatch
	}
	e := &echoer{conn: c, io: io, pp: pp, in: make([]udpio.Message, batch), out: make([]udpio.Message, batch)}
	const size = 65535
	slab := make([]byte, batch*size)
	hdrs := make([]byte, batch*headerRoom)
	for i := range e.in {
		e.in[i].Buf = slab[i*size : (i+1)*size : (i+1)*size]
		e.out[i].Prefix = hdrs[i*headerRoom : i*headerRoom : (i+1)*headerRoom]
	}
	return e, nil
}

// serve echoes until the socket's read deadline passes or it is closed.
func (e *echoer) serve() error {
	for {
		n, err := e.io.ReadBatch(e.in)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		k := 0
		for i := range e.in[:n] {
			if reply(&e.in[i], &e.out[k], e.pp) {
				k++
			}
		}
		if _, err := e.io.WriteBatch(e.out[:k]); err != nil {
			return nil // closed under us
		}
	}
}

// reply prepares out as the answer to in, or reports false when in gets
// none (truncated, or no PPv2 PROXY header in -proxy-protocol mode). out's
// Buf is a view into in's buffer; its Prefix keeps its capacity.
func reply(in, out *udpio.Message, pp bool) bool {
	if in.Err != nil {
		return false
	}
	b := in.Buf[:in.N]
	out.Addr = in.Addr
	if !pp {
		out.Prefix, out.Buf = out.Prefix[:0], b
		return true
	}
	h, off, err := ppv2.Parse(b)
	if err != nil || h.Command != ppv2.Proxy {
		return false
	}
	hdr, err := ppv2.AppendHeader(out.Prefix[:0], ppv2.Header{Command: ppv2.Proxy, Src: h.Dst, Dst: h.Src})
	if err != nil {
		return false
	}
	out.Prefix, out.Buf = hdr, b[off:]
	return true
}
