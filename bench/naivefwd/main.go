// Command naivefwd is the naive baseline of the forwarding benchmark: the
// UDP forwarder most people write first. One ReadFromUDP per client
// datagram, a map from client address to session, and per session an
// upstream socket connected to the backend with its own goroutine that
// relays replies with WriteToUDP. Datagrams go unchanged (no PPv2), so its
// backend is a plain echo. A session ends after -idle without replies.
//
// It prints "naivefwd listening on ADDR" once bound, and stops on SIGINT
// or SIGTERM.
//
//	naivefwd -listen 127.0.0.1:5684 -backend 127.0.0.1:7000
package main

import (
	"context"
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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cmd(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func cmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("naivefwd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "service `ip:port`")
	backend := fs.String("backend", "", "backend `ip:port`, required")
	idle := fs.Duration("idle", time.Minute, "session lifetime without replies")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	be, err := net.ResolveUDPAddr("udp", *backend)
	if err != nil || *backend == "" {
		fmt.Fprintf(stderr, "naivefwd: -backend %q: want ip:port\n", *backend)
		return 2
	}
	la, err := net.ResolveUDPAddr("udp", *listen)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ln, err := net.ListenUDP("udp", la)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "naivefwd listening on %s\n", ln.LocalAddr())
	p := &proxy{ln: ln, backend: be, idle: *idle, sessions: map[netip.AddrPort]*net.UDPConn{}}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	p.serve()
	p.wg.Wait()
	return 0
}

type proxy struct {
	ln      *net.UDPConn
	backend *net.UDPAddr
	idle    time.Duration

	mu       sync.Mutex
	sessions map[netip.AddrPort]*net.UDPConn
	closed   bool
	wg       sync.WaitGroup
}

func (p *proxy) serve() {
	buf := make([]byte, 65535)
	for {
		n, client, err := p.ln.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				p.mu.Lock()
				p.closed = true
				for _, up := range p.sessions {
					up.Close()
				}
				p.mu.Unlock()
				return
			}
			continue
		}
		up, err := p.session(client)
		if err != nil {
			continue
		}
		up.Write(buf[:n])
	}
}

// session returns the client's upstream socket, dialling it and starting
// its reply goroutine on the client's first datagram.
func (p *proxy) session(client *net.UDPAddr) (*net.UDPConn, error) {
	key := client.AddrPort()
	p.mu.Lock()
	defer p.mu.Unlock()
	if up := p.sessions[key]; up != nil {
		return up, nil
	}
	up, err := net.DialUDP("udp", nil, p.backend)
	if err != nil {
		return nil, err
	}
	p.sessions[key] = up
	p.wg.Go(func() { p.replies(key, client, up) })
	return up, nil
}

// replies relays the backend's answers to one client until the session
// idles out or the proxy stops.
func (p *proxy) replies(key netip.AddrPort, client *net.UDPAddr, up *net.UDPConn) {
	buf := make([]byte, 65535)
	for {
		up.SetReadDeadline(time.Now().Add(p.idle))
		n, err := up.Read(buf)
		if err != nil {
			p.mu.Lock()
			if !p.closed {
				delete(p.sessions, key)
				up.Close()
			}
			p.mu.Unlock()
			return
		}
		p.ln.WriteToUDP(buf[:n], client)
	}
}
