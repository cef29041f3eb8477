package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	// WatchPods makes the source read each endpoint's Pod (the endpoint's
	// targetRef) for what an EndpointSlice does not carry: the backend's
	// weight, from the Pod's WeightAnnotation, and when it became ready,
	// from its Ready condition's lastTransitionTime (Backend.ReadySince,
	// which the registry's SlowStart ramps from). Both are fields of the
	// Pod object, so every replica reads the same values. It needs list
	// and watch on pods in the namespace besides endpointslices. Off (the
	// default), every weight is 1 and no backend slow-starts.
	WatchPods bool
	// WeightAnnotation names the Pod annotation that holds the weight,
	// an integer 1 to MaxWeight; "" means DefaultWeightAnnotation. A Pod
	// without it has weight 1; a value out of range or not an integer is
	// refused: the backend keeps weight 1, the refusal is logged once per
	// Pod and value, and counted (Source.BadWeights).
	WeightAnnotation string
	// PodSelector, a label selector such as "app=dtls-backend", narrows
	// the Pod watch to the backends' pods; "" watches every Pod of the
	// namespace. Only with WatchPods.
	PodSelector string
	// Logger receives the source's changes and failures; nil means
	// slog.Default(). Nothing is logged per event: a skipped endpoint, a
	// rejected list or a failing watch is logged once until it changes.
	Logger *slog.Logger
}

// DefaultWeightAnnotation is the Pod annotation read as the weight when
// Config.WeightAnnotation is "".
const DefaultWeightAnnotation = "cidroute.io/weight"

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
//   - weight and ready time (WatchPods only): the endpoint's Pod's
//     WeightAnnotation (1 when absent or refused) and its Ready
//     condition's lastTransitionTime. A ready endpoint whose Pod the
//     cache does not show ready yet gets a ReadySince in the far future,
//     the first step of a slow start, until the Pod's watch catches up.
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

	badWeights atomic.Uint64
}

// BadWeights counts the weight annotations refused (see
// Config.WeightAnnotation): each Pod and value once, while it lasts.
func (s *Source) BadWeights() uint64 { return s.badWeights.Load() }

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
	if cfg.WeightAnnotation == "" {
		cfg.WeightAnnotation = DefaultWeightAnnotation
	}
	if errs := validation.IsQualifiedName(cfg.WeightAnnotation); len(errs) > 0 {
		return nil, fmt.Errorf("%w: weight annotation %q: %s", ErrConfig, cfg.WeightAnnotation, errs[0])
	}
	if cfg.PodSelector != "" {
		if !cfg.WatchPods {
			return nil, fmt.Errorf("%w: a pod selector without WatchPods", ErrConfig)
		}
		if _, err := labels.Parse(cfg.PodSelector); err != nil {
			return nil, fmt.Errorf("%w: pod selector %q: %v", ErrConfig, cfg.PodSelector, err)
		}
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
		m:   mapper{service: cfg.Service, portName: cfg.PortName, addressType: cfg.AddressType, weightKey: cfg.WeightAnnotation},
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

	synced := []cache.InformerSynced{inf.HasSynced}
	m := s.m
	var podFactory informers.SharedInformerFactory
	if s.cfg.WatchPods {
		podFactory = s.podInformer(&m, poke)
		if podFactory == nil {
			return errors.New("kubernetes: starting the pod informer")
		}
		synced = append(synced, podFactory.Core().V1().Pods().Informer().HasSynced)
	}
	hasSynced := func() bool {
		for _, f := range synced {
			if !f() {
				return false
			}
		}
		return true
	}

	factory.Start(ctx.Done())
	if podFactory != nil {
		podFactory.Start(ctx.Done())
	}
	var wg sync.WaitGroup
	defer func() {
		cancel()
		factory.Shutdown() // waits for the informer's goroutines
		if podFactory != nil {
			podFactory.Shutdown()
		}
		wg.Wait()
	}()
	wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), synced...) {
			poke()
		}
	})

	var tick <-chan time.Time
	if every := s.confirmEvery(u); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}

	st := runState{src: s, u: u, m: m}
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
		if hasSynced() {
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

// podInformer sets up the informer of the namespace's Pods (narrowed by
// PodSelector), which keeps of each Pod only what the mapper reads, and
// points m.pod at its cache. Its changes poke the rebuild. Its watch
// failures are logged, once per kind of failure, and do not stop the
// confirmations: the backends and their states come from the
// EndpointSlices; only weights and ready times would be out of date.
func (s *Source) podInformer(m *mapper, poke func()) informers.SharedInformerFactory {
	key := s.cfg.WeightAnnotation
	f := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, 0,
		informers.WithNamespace(s.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.cfg.PodSelector }),
		informers.WithTransform(func(obj any) (any, error) {
			p, ok := obj.(*corev1.Pod)
			if !ok {
				return obj, nil // a tombstone
			}
			return trimPod(p, key), nil
		}))
	pi := f.Core().V1().Pods()
	inf := pi.Informer()
	health := &watchHealth{log: s.log, pods: true}
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() == nil {
			health.failed(err, false)
		}
	}); err != nil {
		s.log.Error("kubernetes: pod informer", "err", err)
		return nil
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		s.log.Error("kubernetes: pod informer", "err", err)
		return nil
	}
	lister := pi.Lister().Pods(s.cfg.Namespace)
	m.pod = func(name string) *corev1.Pod {
		p, err := lister.Get(name)
		if err != nil {
			return nil
		}
		return p
	}
	return f
}

// trimPod keeps of a Pod its identity, the weight annotation and its
// Ready condition: the cache holds thousands of them.
func trimPod(p *corev1.Pod, weightKey string) *corev1.Pod {
	t := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
	}}
	if v, ok := p.Annotations[weightKey]; ok {
		t.Annotations = map[string]string{weightKey: v}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			t.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime}}
		}
	}
	return t
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
	m   mapper // src.m, with the pod cache when WatchPods

	dirty     bool               // a change arrived since the last rebuild
	sent      bool               // last holds a list that was passed to Update
	last      []registry.Backend // the last list passed to Update
	accepted  bool               // whether Update accepted last
	published []registry.Backend // the last list Update accepted
	skips     map[skip]bool      // skipped endpoints already logged
	bad       map[skip]bool      // refused weight annotations already logged and counted
}

// rebuild maps the slices, passes the list to the Updater when it differs
// from the last one, and logs what changed: newly skipped endpoints, a
// rejection (once per distinct list), the new backend counts.
func (st *runState) rebuild(in []*discoveryv1.EndpointSlice) {
	st.dirty = false
	log := st.src.log
	bs, skips, bad := st.m.backends(in)

	now := make(map[skip]bool, len(skips))
	for _, k := range skips {
		now[k] = true
		if !st.skips[k] {
			log.Warn("kubernetes: endpoint skipped", "slice", k.slice, "endpoint", k.endpoint, "reason", k.reason)
		}
	}
	st.skips = now
	nowBad := make(map[skip]bool, len(bad))
	for _, k := range bad {
		nowBad[k] = true
		if !st.bad[k] {
			st.src.badWeights.Add(1)
			log.Warn("kubernetes: weight annotation refused", "slice", k.slice, "endpoint", k.endpoint, "reason", k.reason)
		}
	}
	st.bad = nowBad

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
