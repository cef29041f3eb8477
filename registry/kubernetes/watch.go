package kubernetes

import (
	"context"
	"log/slog"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"
	typeddiscoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/util/watchlist"
)

// watchHealth tracks whether the informer's watch is established. The
// informer's watch error handler alone cannot tell: the reflector calls it
// only when a whole list-and-watch round fails, retries a refused watch
// connection internally without calling it, and never reports success. So
// the client the informer uses is wrapped (observedClient) and every List
// and Watch call of the EndpointSlice informer reports here.
//
// Healthy means: the last Watch call succeeded and nothing failed since. A
// Watch call is made only when the previous watch has ended, so the state is
// cleared when one starts.
type watchHealth struct {
	log  *slog.Logger
	pods bool // the Pod watch (Config.WatchPods), whose failures do not stop confirmations

	mu      sync.Mutex
	healthy bool
	failing string // the kind of the failure last logged (failureKind); "" after a success
}

func (h *watchHealth) ok() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy
}

// watchStarting is called when the reflector opens a new watch.
func (h *watchHealth) watchStarting() {
	h.mu.Lock()
	h.healthy = false
	h.mu.Unlock()
}

// watching is called when a Watch call succeeded.
func (h *watchHealth) watching() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.healthy = true
	if h.failing != "" {
		h.failing = ""
		h.log.Info("kubernetes: watching " + h.what() + " again")
	}
}

// failed is called for a failed List or Watch call and from the informer's
// watch error handler. It logs once per outage and kind of failure, not
// once per retry: an API server that comes back refusing the proxy
// (Forbidden after a restart that ended an authorized watch) is logged
// again, so the log names what is wrong now. A quiet failure (a streaming
// list the server does not offer) is logged at debug level only.
func (h *watchHealth) failed(err error, quiet bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.healthy = false
	if quiet {
		h.log.Debug("kubernetes: streaming list failed; the informer falls back to a plain list", "err", err)
		return
	}
	if k := failureKind(err); k != h.failing {
		h.failing = k
		if h.pods {
			h.log.Warn("kubernetes: cannot watch Pods; backend weights and ready times stay as they were until the watch is back", "err", err)
			return
		}
		h.log.Warn("kubernetes: cannot watch EndpointSlices; not confirming the backends until the watch is back", "err", err)
	}
}

func (h *watchHealth) what() string {
	if h.pods {
		return "Pods"
	}
	return "EndpointSlices"
}

// failureKind classifies a failure for the log: the reason of an API
// status (Forbidden, Unauthorized, ServiceUnavailable, ...), else
// "unreachable" (refused or broken connections, timeouts, TLS).
func failureKind(err error) string {
	if r := apierrors.ReasonForError(err); r != metav1.StatusReasonUnknown {
		return string(r)
	}
	return "unreachable"
}

// observedClient is the caller's client with the EndpointSlice List and
// Watch calls reporting to a watchHealth. Everything else passes through.
type observedClient struct {
	k8s.Interface
	h *watchHealth
}

func (c observedClient) DiscoveryV1() typeddiscoveryv1.DiscoveryV1Interface {
	return observedDiscovery{c.Interface.DiscoveryV1(), c.h}
}

// IsWatchListSemanticsUnSupported passes the wrapped client's answer on to
// the reflector, which asks the client it was given (fake clientsets say
// they cannot stream lists).
func (c observedClient) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(c.Interface)
}

type observedDiscovery struct {
	typeddiscoveryv1.DiscoveryV1Interface
	h *watchHealth
}

func (d observedDiscovery) EndpointSlices(namespace string) typeddiscoveryv1.EndpointSliceInterface {
	return observedSlices{d.DiscoveryV1Interface.EndpointSlices(namespace), d.h}
}

type observedSlices struct {
	typeddiscoveryv1.EndpointSliceInterface
	h *watchHealth
}

func (s observedSlices) List(ctx context.Context, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	l, err := s.EndpointSliceInterface.List(ctx, opts)
	if err != nil && ctx.Err() == nil {
		s.h.failed(err, false)
	}
	return l, err
}

func (s observedSlices) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	s.h.watchStarting()
	w, err := s.EndpointSliceInterface.Watch(ctx, opts)
	switch {
	case err == nil:
		s.h.watching()
	case ctx.Err() == nil:
		// A server that refuses streaming lists answers 400 or 422, and
		// the reflector falls back to a plain list: not an outage.
		streaming := opts.SendInitialEvents != nil && *opts.SendInitialEvents
		s.h.failed(err, streaming && (apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)))
	}
	return w, err
}
