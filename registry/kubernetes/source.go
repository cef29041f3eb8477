package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cidroute/cidroute/registry"
)

// ErrConfig is wrapped by the errors of New for an unusable Config.
var ErrConfig = errors.New("kubernetes: bad config")

// Config configures a Source. Client and Service are required; the zero
// value of every other field means its default.
type Config struct {
	// Client talks to the API server; see NewClient.
	Client k8s.Interface
	// Namespace of the Service; "" means "default".
	Namespace string
	// Service whose EndpointSlices are watched: the headless Service of
	// the backends' StatefulSet.
	Service string
	// PortName is the name of the Service's UDP port the backends listen
	// on. "" is allowed when the Service has exactly one port.
	PortName string
	// AddressType picks the address family of a dual-stack Service:
	// discoveryv1.AddressTypeIPv4 or AddressTypeIPv6. "" means IPv4 when
	// the Service has IPv4 slices, IPv6 otherwise.
	AddressType discoveryv1.AddressType
	// ConfirmEvery is how often the source confirms the backends while its
	// watch is healthy. 0 means a quarter of the registry's MaxAge (when
	// the Updater has a MaxAge method, as *registry.Registry does; no
	// confirmations when MaxAge is 0), or 1s.
	ConfirmEvery time.Duration
	// Logger receives the source's changes and failures; nil means
	// slog.Default(). Nothing is logged per event: a skipped endpoint, a
	// rejected list or a failing watch is logged once until it changes.
	Logger *slog.Logger
}

// Source is a registry.Source that follows a Service's EndpointSlices
// (discovery.k8s.io/v1) with a client-go informer, which lists them once
// and then watches for changes; it never polls.
//
// Every EndpointSlice labelled kubernetes.io/service-name=<Service> in the
// namespace is merged into one backend list:
//
//   - ordinal: the endpoint's hostname, or else its Pod's name, must end
//     in -N with N in 0–254 ("ds-2" → 2), as StatefulSet pods do. Other
//     endpoints are skipped and logged.
//   - address: the endpoint's first address and the slice's port named
//     PortName, which must be UDP.
//   - state: ready (ready, serving and not terminating) → Ready; serving
//     and terminating → Draining; anything else → Gone. Gone endpoints
//     stay in the list, so that datagrams for their connection IDs are
//     counted as not serving rather than as an unknown ordinal.
//
// An endpoint listed in two slices (while the EndpointSlice controller
// moves it) counts once, in its most serving state. A list the registry
// rejects, such as two pods claiming one ordinal, is logged and leaves the
// previous backends in place.
//
// Freshness: while the informer has synced, its watch is established and
// the last list was accepted, Run confirms the backends every
// ConfirmEvery. When the API server cannot be reached (or the list keeps
// being rejected) it stops confirming, so a registry with a MaxAge turns
// stale and refuses new handshakes; once the watch is back it confirms
// again and the registry recovers.
//
// A Source runs at most once at a time.
type Source struct {
	cfg Config
	log *slog.Logger
	m   mapper

	afterSync func() // tests: called after every pass of the Run loop
}

var _ registry.Source = (*Source)(nil)

// New checks cfg and returns a Source. It does not contact the API server.
func New(cfg Config) (*Source, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: no Client", ErrConfig)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = metav1.NamespaceDefault
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("%w: namespace %q: %s", ErrConfig, cfg.Namespace, errs[0])
	}
	if errs := validation.IsDNS1035Label(cfg.Service); len(errs) > 0 {
		return nil, fmt.Errorf("%w: service %q: %s", ErrConfig, cfg.Service, errs[0])
	}
	switch cfg.AddressType {
	case "", discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
	default:
		return nil, fmt.Errorf("%w: address type %q (want IPv4 or IPv6)", ErrConfig, cfg.AddressType)
	}
	if cfg.ConfirmEvery < 0 {
		return nil, fmt.Errorf("%w: negative ConfirmEvery %v", ErrConfig, cfg.ConfirmEvery)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Source{
		cfg: cfg,
		log: log.With("namespace", cfg.Namespace, "k8s_service", cfg.Service),
		m:   mapper{service: cfg.Service, portName: cfg.PortName, addressType: cfg.AddressType},
	}, nil
}

// Run implements registry.Source. It starts the informer, publishes the
// backend list once the informer has synced and again on every change, and
// confirms it while the watch is healthy. It returns nil when ctx is done,
// after the informer has stopped. API errors are logged and retried by the
// informer, never returned.
func (s *Source) Run(ctx context.Context, u registry.Updater) error {
	if u == nil {
		return errors.New("kubernetes: nil Updater")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	health := &watchHealth{log: s.log}
	selector := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.cfg.Service})
	factory := informers.NewSharedInformerFactoryWithOptions(
		observedClient{s.cfg.Client, health},
		0, // no resync: the backend list is rebuilt from the cache on every event
		informers.WithNamespace(s.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector.String() }),
	)
	sliceInformer := factory.Discovery().V1().EndpointSlices()
	inf := sliceInformer.Informer()
	lister := sliceInformer.Lister().EndpointSlices(s.cfg.Namespace)
	// Replaces client-go's handler, which logs every retry through klog.
	err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() == nil {
			health.failed(err, false)
		}
	})
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}

	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default: // a rebuild is already pending; it will see this change too
		}
	}
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	})
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}

	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		factory.Shutdown() // waits for the informer's goroutines
		wg.Wait()
	}()
	wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			poke()
		}
	})

	var tick <-chan time.Time
	if every := s.confirmEvery(u); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}

	st := runState{src: s, u: u}
	for {
		confirm := false
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			st.dirty = true
		case <-tick:
			confirm = true
		}
		if inf.HasSynced() {
			if st.dirty {
				got, err := lister.List(selector)
				if err != nil { // the cache's lister does not fail; keep the last list
					s.log.Error("kubernetes: listing the informer cache", "err", err)
				} else {
					st.rebuild(got)
				}
			}
			if confirm && st.accepted && health.ok() {
				u.Confirm()
			}
		}
		if s.afterSync != nil {
			s.afterSync()
		}
	}
}

// confirmEvery returns the confirmation period for u, 0 for none.
func (s *Source) confirmEvery(u registry.Updater) time.Duration {
	if s.cfg.ConfirmEvery > 0 {
		return s.cfg.ConfirmEvery
	}
	if m, ok := u.(interface{ MaxAge() time.Duration }); ok {
		if a := m.MaxAge(); a > 0 {
			return max(a/4, time.Millisecond)
		}
		return 0
	}
	return time.Second
}

// runState is what one Run remembers between rebuilds.
type runState struct {
	src *Source
	u   registry.Updater

	dirty     bool               // a change arrived since the last rebuild
	sent      bool               // last holds a list that was passed to Update
	last      []registry.Backend // the last list passed to Update
	accepted  bool               // whether Update accepted last
	published []registry.Backend // the last list Update accepted
	skips     map[skip]bool      // skipped endpoints already logged
}

// rebuild maps the slices, passes the list to the Updater when it differs
// from the last one, and logs what changed: newly skipped endpoints, a
// rejection (once per distinct list), the new backend counts.
func (st *runState) rebuild(in []*discoveryv1.EndpointSlice) {
	st.dirty = false
	log := st.src.log
	bs, skips := st.src.m.backends(in)

	now := make(map[skip]bool, len(skips))
	for _, k := range skips {
		now[k] = true
		if !st.skips[k] {
			log.Warn("kubernetes: endpoint skipped", "slice", k.slice, "endpoint", k.endpoint, "reason", k.reason)
		}
	}
	st.skips = now

	if len(bs) == 0 {
		// No endpoints (scaled to zero, slices deleted): the registry
		// refuses an empty list, so say the same with the last published
		// backends, all gone; their CIDs then count as not serving. Before
		// anything was published the registry is empty already, which is
		// the truth to confirm.
		if st.published == nil {
			st.sent, st.last, st.accepted = true, bs, true
			log.Info("kubernetes: the service has no endpoints")
			return
		}
		bs = slices.Clone(st.published)
		for i := range bs {
			bs[i].State = registry.Gone
		}
	}
	if st.sent && slices.Equal(bs, st.last) {
		return
	}
	st.sent, st.last = true, bs
	if err := st.u.Update(bs); err != nil {
		st.accepted = false
		log.Error("kubernetes: backend list rejected; keeping the previous backends and not confirming them", "err", err, "backends", len(bs))
		return
	}
	st.accepted, st.published = true, bs
	var n [registry.Gone + 1]int
	for _, b := range bs {
		n[b.State]++
	}
	attrs := []any{"ready", n[registry.Ready], "draining", n[registry.Draining], "gone", n[registry.Gone]}
	// The snapshot's version (cidroute_registry_snapshot_version) tells
	// one update from the next with the same counts, which a log that
	// holds back repeated lines would otherwise fold together.
	if r, ok := st.u.(interface{ Stats() registry.Stats }); ok {
		attrs = append(attrs, "version", r.Stats().Version)
	}
	log.Info("kubernetes: backends updated", attrs...)
}
