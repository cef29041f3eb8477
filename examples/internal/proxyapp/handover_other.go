//go:build !linux

package proxyapp

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"syscall"
	"time"
)

var errNoHandover = errors.New("-handover needs Linux (descriptor passing with SO_PEERCRED)")

func dialHandover(path string) (*net.UnixConn, error) { return nil, errNoHandover }

type handoverListener struct{}

func listenHandover(path string, log *slog.Logger) (*handoverListener, error) {
	return nil, errNoHandover
}

func checkHandoverDir(path string) error { return errNoHandover }

func dupFile(c syscall.Conn) (*os.File, error) { return nil, errNoHandover }

func (l *handoverListener) accept() (*net.UnixConn, error) { return nil, errNoHandover }

func (l *handoverListener) close(handedOver bool) {}

func sendHandover(c *net.UnixConn, m hoMsg, conns []syscall.Conn, deadline time.Time) error {
	return errNoHandover
}

func recvHandover(c *net.UnixConn, deadline time.Time) (hoMsg, []*os.File, error) {
	return hoMsg{}, nil, errNoHandover
}
