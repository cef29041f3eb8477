package shutdown

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Signals returns the contexts a server stops by: drain is done at the
// first SIGTERM or SIGINT, kill at the second.
func Signals() (drain, kill context.Context) {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	return fromSignals(sig)
}

func fromSignals(sig <-chan os.Signal) (drain, kill context.Context) {
	drain, startDrain := context.WithCancel(context.Background())
	kill, stopNow := context.WithCancel(context.Background())
	go func() {
		<-sig
		startDrain()
		<-sig
		stopNow()
	}()
	return drain, kill
}

// A Drainer is a server that drains: a *piondtls.Listener, or the echo
// servers of dtlsecho and quicecho. One that also has an Open() int
// method, the number of sessions not ended yet, gets it logged.
type Drainer interface {
	// Drain refuses new sessions at once and serves the open ones until
	// they end or ctx is done; it closes those left and says how many.
	Drain(ctx context.Context) (cut int)
	// Close stops the server at once, when the drain is not wanted or
	// could not start.
	Close() error
}

// DefaultTimeout is Config.Timeout's default: below the 30 s
// terminationGracePeriodSeconds Kubernetes gives a pod by default.
const DefaultTimeout = 25 * time.Second

// Config configures Drain. The zero value is usable.
type Config struct {
	// Timeout is how long the open sessions are served once draining
	// starts: 0 means DefaultTimeout, a negative Timeout cuts them at
	// once. Keep it below the pod's termination grace period, so that the
	// sessions left are closed cleanly before the kubelet kills the
	// process.
	Timeout time.Duration
	// Logger receives one line when draining starts and one when it is
	// done (nil: slog.Default()).
	Logger *slog.Logger
	// Name is the server's name in those lines ("dtls-backend"; default
	// "server"), Unit what Open counts ("connections"; default
	// "sessions").
	Name, Unit string
}

// Drain waits until drain is done, then drains srv for cfg.Timeout or
// until kill is done, and closes it. It logs both steps: how many sessions
// were open, how many ended by themselves, how many were cut.
func Drain(drain, kill context.Context, srv Drainer, cfg Config) {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Name == "" {
		cfg.Name = "server"
	}
	if cfg.Unit == "" {
		cfg.Unit = "sessions"
	}
	<-drain.Done()
	msg := cfg.Name + " draining: new " + cfg.Unit + " are refused, open ones are served until they end or the drain timeout"
	o, counts := srv.(interface{ Open() int })
	open := 0
	if counts {
		open = o.Open()
		cfg.Logger.Info(msg, "open", open, "drain_timeout", max(cfg.Timeout, 0))
	} else {
		cfg.Logger.Info(msg, "drain_timeout", max(cfg.Timeout, 0))
	}
	ctx, cancel := context.WithTimeout(kill, cfg.Timeout)
	start := time.Now()
	cut := srv.Drain(ctx)
	cancel()
	took := time.Since(start).Round(time.Millisecond)
	if counts {
		cfg.Logger.Info(cfg.Name+" drained", "ended", open-cut, "cut", cut, "took", took)
	} else {
		cfg.Logger.Info(cfg.Name+" drained", "cut", cut, "took", took)
	}
	srv.Close()
}
