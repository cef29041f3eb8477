//go:build !linux

package udpio

import (
	"fmt"
	"net"
	"syscall"
)

// A Conn reads and writes datagrams of a *net.UDPConn with the Message API.
// On this platform it moves one datagram per syscall: ReadBatch returns at
// most one message, WriteBatch loops. Small receive buffers and prefixes
// cost one copy each. Local is not supported on send (ErrNotSupported in
// Message.Err) and never reported on receive.
//
// One goroutine may call ReadBatch while another calls WriteBatch; neither
// method may be called concurrently with itself.
type Conn struct{ p portable }

// NewConn prepares IO on c; batch is validated as on Linux and otherwise
// unused.
func NewConn(c *net.UDPConn, batch int) (*Conn, error) {
	if batch < 0 || batch > 1024 {
		return nil, fmt.Errorf("batch %d: %w", batch, ErrConfig)
	}
	return &Conn{p: newPortable(c)}, nil
}

// PacketInfo reports false: the portable path does not report Message.Local.
func (c *Conn) PacketInfo() bool { return false }

// ReadBatch receives one datagram into ms[0]; see the Linux documentation.
func (c *Conn) ReadBatch(ms []Message) (int, error) { return c.p.readBatch(ms) }

// WriteBatch sends every message of ms, one syscall each, with the same
// per-datagram error reporting as on Linux.
func (c *Conn) WriteBatch(ms []Message) (int, error) { return c.p.writeBatch(ms) }

// Detach is not supported on this platform (there is no Poller): Conns
// wait on the netpoller. It returns an error wrapping ErrNotSupported and
// leaves the Conn as it was.
func (c *Conn) Detach() error { return fmt.Errorf("detach: %w", ErrNotSupported) }

// SyscallConn gives access to the UDPConn's socket.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.p.c.SyscallConn() }

// Close closes the UDPConn.
func (c *Conn) Close() error { return c.p.c.Close() }
