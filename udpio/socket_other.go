//go:build !linux

package udpio

import (
	"context"
	"fmt"
	"net"
	"syscall"
)

// ListenGroup opens one UDP socket on this platform; groups of more than
// one socket, PacketInfo and JoinExisting need Linux and return an error
// wrapping ErrNotSupported. Joinable is ignored.
func ListenGroup(network, addr string, n int, cfg ListenConfig) ([]*net.UDPConn, error) {
	if n < 1 {
		return nil, fmt.Errorf("group of %d sockets: %w", n, ErrConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if n > 1 || cfg.PacketInfo || cfg.JoinExisting {
		return nil, fmt.Errorf("reuseport groups, joining them and packet info: %w", ErrNotSupported)
	}
	pc, err := (&net.ListenConfig{}).ListenPacket(context.Background(), network, addr)
	if err != nil {
		return nil, fmt.Errorf("udpio: %w", err)
	}
	c := pc.(*net.UDPConn)
	if cfg.RecvBuffer > 0 {
		err = c.SetReadBuffer(cfg.RecvBuffer)
	}
	if err == nil && cfg.SendBuffer > 0 {
		err = c.SetWriteBuffer(cfg.SendBuffer)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("udpio: %w", err)
	}
	return []*net.UDPConn{c}, nil
}

// BufferSizes returns an error wrapping ErrNotSupported on this platform.
func BufferSizes(c syscall.Conn) (recv, send int, err error) {
	return 0, 0, fmt.Errorf("buffer sizes: %w", ErrNotSupported)
}

// AttachSteering returns an error wrapping ErrNotSupported on this platform
// (after validating s).
func AttachSteering(group []*net.UDPConn, s Steering) error {
	if err := s.validate(); err != nil {
		return err
	}
	return fmt.Errorf("reuseport steering: %w", ErrNotSupported)
}

// KernelDrops is not supported on this platform; it returns an error
// wrapping ErrNotSupported.
func KernelDrops(c syscall.Conn) (uint32, error) {
	return 0, fmt.Errorf("kernel drops: %w", ErrNotSupported)
}

// ReadMemInfo is not supported on this platform; it returns an error
// wrapping ErrNotSupported.
func ReadMemInfo(c syscall.Conn) (MemInfo, error) {
	return MemInfo{}, fmt.Errorf("SO_MEMINFO: %w", ErrNotSupported)
}

// Configure applies cfg's buffer sizes to a bound socket; PacketInfo
// returns an error wrapping ErrNotSupported on this platform.
func Configure(c *net.UDPConn, cfg ListenConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.PacketInfo {
		return fmt.Errorf("packet info: %w", ErrNotSupported)
	}
	var err error
	if cfg.RecvBuffer > 0 {
		err = c.SetReadBuffer(cfg.RecvBuffer)
	}
	if err == nil && cfg.SendBuffer > 0 {
		err = c.SetWriteBuffer(cfg.SendBuffer)
	}
	if err != nil {
		return fmt.Errorf("udpio: %w", err)
	}
	return nil
}

// AttachFilter is not supported on this platform; it returns an error
// wrapping ErrNotSupported (f == nil, removing a filter, is a no-op).
func AttachFilter(c syscall.Conn, f *Filter) error {
	if f == nil {
		return nil
	}
	return fmt.Errorf("socket filter: %w", ErrNotSupported)
}
