package udpio

import (
	"errors"
	"net"
	"net/netip"
	"os"

	"github.com/cidroute/cidroute/internal/addr"
)

// portable is the one-datagram-per-syscall IO behind Conn on systems
// without recvmmsg/sendmmsg. It has no build tag so that its tests run on
// Linux too.
type portable struct {
	c *net.UDPConn
	// rbuf receives a datagram when the caller's Buf might be too small to
	// tell truncation apart portably (Windows reports it as an error, Unix
	// systems as a flag of differing value); wbuf joins Prefix and Buf.
	rbuf, wbuf []byte
}

func newPortable(c *net.UDPConn) portable {
	return portable{c: c, rbuf: make([]byte, maxDatagram)}
}

func (p *portable) readBatch(ms []Message) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	m := &ms[0]
	buf := m.Buf
	direct := len(buf) >= maxDatagram
	if !direct {
		buf = p.rbuf
	}
	n, from, err := p.c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return 0, err
	}
	m.Err = nil
	if !direct {
		copy(m.Buf, buf[:n])
		if n > len(m.Buf) {
			n, m.Err = len(m.Buf), ErrTruncated
		}
	}
	m.N, m.Addr, m.Local = n, addr.Unmap(from), netip.Addr{}
	return 1, nil
}

func (p *portable) writeBatch(ms []Message) (int, error) {
	sent := 0
	for i := range ms {
		m := &ms[i]
		m.Err = nil
		dst := addr.Unmap(m.Addr)
		switch {
		case !dst.IsValid():
			m.Err = ErrAddress
			continue
		case m.Local.IsValid():
			m.Err = ErrNotSupported
			continue
		}
		b := m.Buf
		if len(m.Prefix) > 0 {
			p.wbuf = append(append(p.wbuf[:0], m.Prefix...), m.Buf...)
			b = p.wbuf
		}
		if _, err := p.c.WriteToUDPAddrPort(b, dst); err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
				for j := i; j < len(ms); j++ {
					ms[j].Err = err
				}
				return sent, err
			}
			m.Err = err
			continue
		}
		sent++
	}
	return sent, nil
}
