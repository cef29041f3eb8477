package proxyapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/proxyconfig"
)

// An Accelerator is a fast path beside the pipeline: the XDP program of
// module cidroute/xdp (xdp.Accelerate), which decides in the driver what
// it can and hands the rest up to the pipeline's sockets.
type Accelerator interface {
	// Run keeps the fast path's view of the registries current until ctx
	// is done.
	Run(ctx context.Context) error
	// Stats are the datagrams the fast path decided, by service; those it
	// handed up are in the pipeline's own Stats.
	Stats() []cidroute.ServiceStats
	Close() error
}

// XDPFunc starts the fast path for a built pipeline on the given
// interfaces; cidproxy's main passes one wrapping xdp.Accelerate.
type XDPFunc func(pipe *cidroute.Pipeline, services []cidroute.Service, maxDatagram int, interfaces []string, log *slog.Logger) (Accelerator, error)

var errNoXDP = errors.New(`"xdp_interfaces" needs a build of cidproxy with the XDP fast path (module cidroute/xdp)`)

// startXDP attaches the fast path when the configuration names
// interfaces. pc is the pipeline's configuration.
func (p *proxy) startXDP(cfg *proxyconfig.Config, pc cidroute.Config, opts Options, log *slog.Logger) error {
	if len(cfg.XDPInterfaces) == 0 {
		return nil
	}
	if opts.XDP == nil {
		return errNoXDP
	}
	for _, n := range cfg.XDPInterfaces {
		if _, err := net.InterfaceByName(n); err != nil {
			return fmt.Errorf("xdp_interfaces: %q: %w", n, err)
		}
	}
	a, err := opts.XDP(p.pipe, pc.Services, pc.MaxDatagram, cfg.XDPInterfaces, log)
	if err != nil {
		return err
	}
	p.accel = a
	return nil
}

// runXDP runs the fast path beside the pipeline until ctx is done.
func (p *proxy) runXDP(ctx context.Context) {
	if p.accel == nil {
		return
	}
	p.sources.Go(func() {
		if err := p.accel.Run(ctx); err != nil {
			p.log.Error("xdp: stopped; the pipeline serves everything", "err", err)
		}
	})
}

// closeXDP detaches the fast path, so that the sockets get every datagram.
func (p *proxy) closeXDP() {
	if p.accel != nil {
		if err := p.accel.Close(); err != nil {
			p.log.Error("xdp: detaching", "err", err)
		}
		p.accel = nil
	}
}

// xdpStats are the fast path's counters, none without it.
func (p *proxy) xdpStats() []cidroute.ServiceStats {
	if a := p.accel; a != nil {
		return a.Stats()
	}
	return nil
}
