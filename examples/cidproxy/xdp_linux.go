package main

import (
	"log/slog"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/examples/internal/proxyapp"
	"github.com/cidroute/cidroute/xdp"
)

// startXDP is the "xdp_interfaces" fast path (module cidroute/xdp).
func startXDP(pipe *cidroute.Pipeline, services []cidroute.Service, maxDatagram int, interfaces []string, log *slog.Logger) (proxyapp.Accelerator, error) {
	return xdp.Accelerate(pipe, services, maxDatagram, interfaces, log)
}
