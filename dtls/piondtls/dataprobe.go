package piondtls

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/ppv2"
)

// DataProbeConfig configures DataProbe.
type DataProbeConfig struct {
	// Client is the client side of the handshake: credentials the
	// backends accept (a PSK, certificates), cipher suites. It is copied;
	// a nil ConnectionIDGenerator becomes pion.OnlySendCIDGenerator(), so
	// that the echo travels in CID records under the backend's CID, as
	// clients' datagrams do. Required.
	Client *pion.Config
	// Direct sends without PROXY headers (backends of a transparent
	// service); otherwise every datagram carries a PROXY header naming
	// the prober's own socket as the client, and the backend's replies
	// come back with one, as through the proxy's upstream path.
	Direct bool
	// Echoed reports whether got, the backend's answer, echoes sent (16
	// random bytes per probe); nil means that got ends with sent, as the
	// answers of echo servers that prefix their own tag do.
	Echoed func(sent, got []byte) bool
}

// DataProbe returns a health probe (health.Config.Probe) that checks the
// data path of a DTLS backend, not only its hello: a full handshake, then
// one application datagram that the backend must echo, within the
// checker's timeout. A backend that answers hellos but whose sessions
// drop data fails it. It suits backends that can serve it (an echo
// service, a CoAP ping answered in kind); each probe costs the backend a
// session and a handshake, so give the checker a longer interval than
// the protocol probe's. Errors wrap health.ErrTimeout (no handshake or
// no echo in time), health.ErrRefused or health.ErrBadAnswer (a failed
// handshake, a wrong echo). A passed probe is health.Tied: the echo came
// through the session's keys.
func DataProbe(cfg DataProbeConfig) (health.ProbeFunc, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: DataProbe needs a client configuration", health.ErrConfig)
	}
	conf := *cfg.Client
	if conf.ConnectionIDGenerator == nil {
		conf.ConnectionIDGenerator = pion.OnlySendCIDGenerator()
	}
	echoed := cfg.Echoed
	if echoed == nil {
		echoed = func(sent, got []byte) bool { return bytes.HasSuffix(got, sent) }
	}
	return func(ctx context.Context, addr netip.AddrPort) (time.Duration, health.Match, error) {
		start := time.Now()
		if err := dataProbe(ctx, addr, &conf, cfg.Direct, echoed); err != nil {
			return 0, health.Untied, err
		}
		return time.Since(start), health.Tied, nil
	}, nil
}

func dataProbe(ctx context.Context, addr netip.AddrPort, conf *pion.Config, direct bool, echoed func(sent, got []byte) bool) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr.String())
	if err != nil {
		return err
	}
	uc := c.(*net.UDPConn)
	pc := &proxiedConn{c: uc}
	if !direct {
		local := uc.LocalAddr().(*net.UDPAddr).AddrPort()
		src := netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
		if pc.hdr, err = ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: src, Dst: addr}); err != nil {
			uc.Close()
			return err
		}
	}
	dc, err := pion.Client(pc, net.UDPAddrFromAddrPort(addr), conf)
	if err != nil {
		uc.Close()
		return err
	}
	defer dc.Close()
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := dc.HandshakeContext(ctx); err != nil {
		return dataProbeError(ctx, "handshake", err)
	}
	sent := make([]byte, 16)
	rand.Read(sent)
	if dl, ok := ctx.Deadline(); ok {
		dc.SetDeadline(dl)
	}
	if _, err := dc.Write(sent); err != nil {
		return dataProbeError(ctx, "sending the echo", err)
	}
	buf := make([]byte, 2048)
	n, err := dc.Read(buf)
	if err != nil {
		return dataProbeError(ctx, "waiting for the echo", err)
	}
	if !echoed(sent, buf[:n]) {
		return fmt.Errorf("%w: the echo of %x was %q", health.ErrBadAnswer, sent, buf[:n])
	}
	return nil
}

// dataProbeError classifies an error of the data probe.
func dataProbeError(ctx context.Context, step string, err error) error {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%w: %s: %v", health.ErrRefused, step, err)
	case ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s: %v", health.ErrTimeout, step, err)
	}
	return fmt.Errorf("%w: %s: %v", health.ErrBadAnswer, step, err)
}

// maxProxyHeader bounds the PROXY header of a backend's answer: 52 bytes
// for IPv6, and room for TLVs.
const maxProxyHeader = 512

// proxiedConn is the prober's side of the data probe: a connected socket
// to one backend that puts hdr (a PROXY header, or nothing) before each
// datagram and takes the header off each answer.
type proxiedConn struct {
	c   *net.UDPConn
	hdr []byte
}

func (p *proxiedConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	if len(p.hdr) == 0 {
		return p.c.Write(b)
	}
	if _, err := p.c.Write(append(p.hdr[:len(p.hdr):len(p.hdr)], b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (p *proxiedConn) ReadFrom(b []byte) (int, net.Addr, error) {
	buf := make([]byte, len(b)+maxProxyHeader)
	for {
		n, err := p.c.Read(buf)
		if err != nil {
			return 0, nil, err
		}
		payload := buf[:n]
		if len(p.hdr) != 0 {
			_, off, err := ppv2.Parse(payload)
			if err != nil {
				continue // not the backend's answer through the proxy path
			}
			payload = payload[off:]
		}
		return copy(b, payload), p.c.RemoteAddr(), nil
	}
}

func (p *proxiedConn) Close() error                       { return p.c.Close() }
func (p *proxiedConn) LocalAddr() net.Addr                { return p.c.LocalAddr() }
func (p *proxiedConn) SetDeadline(t time.Time) error      { return p.c.SetDeadline(t) }
func (p *proxiedConn) SetReadDeadline(t time.Time) error  { return p.c.SetReadDeadline(t) }
func (p *proxiedConn) SetWriteDeadline(t time.Time) error { return p.c.SetWriteDeadline(t) }

var _ net.PacketConn = (*proxiedConn)(nil)
