package kubernetes

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cidroute/cidroute/registry"
)

// cluster is a fake API server whose EndpointSlice list and watch can be
// made to fail, as when the API server is unreachable.
type cluster struct {
	t  *testing.T
	cs *fake.Clientset

	mu       sync.Mutex
	down     error // returned by list and watch while set
	watchers []watch.Interface
}

var slicesGVR = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

func newCluster(t *testing.T, objs ...runtime.Object) *cluster {
	c := &cluster{t: t, cs: fake.NewClientset(objs...)}
	c.cs.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.down != nil {
			return true, nil, c.down
		}
		return false, nil, nil
	})
	c.cs.PrependWatchReactor("endpointslices", func(a k8stesting.Action) (bool, watch.Interface, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.down != nil {
			return true, nil, c.down
		}
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := c.cs.Tracker().Watch(slicesGVR, a.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		c.watchers = append(c.watchers, w)
		return true, w, nil
	})
	return c
}

// fail makes list and watch return err and ends the open watches, as a
// restarting or unreachable API server does.
func (c *cluster) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = err
	for _, w := range c.watchers {
		w.Stop()
	}
	c.watchers = nil
}

func (c *cluster) recover() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = nil
}

func (c *cluster) create(s *discoveryv1.EndpointSlice) {
	c.t.Helper()
	_, err := c.cs.DiscoveryV1().EndpointSlices(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{})
	require.NoError(c.t, err)
}

func (c *cluster) update(s *discoveryv1.EndpointSlice) {
	c.t.Helper()
	_, err := c.cs.DiscoveryV1().EndpointSlices(s.Namespace).Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(c.t, err)
}

func (c *cluster) delete(name string) {
	c.t.Helper()
	err := c.cs.DiscoveryV1().EndpointSlices("ns").Delete(context.Background(), name, metav1.DeleteOptions{})
	require.NoError(c.t, err)
}

// records is a slog.Handler keeping every record.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *records) WithGroup(string) slog.Handler            { return h }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// count returns how many records at level contain msg.
func (h *records) count(level slog.Level, msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

// errAttrs returns the "err" attributes of the records at level that
// contain msg, in order.
func (h *records) errAttrs(level slog.Level, msg string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []string
	for _, r := range h.recs {
		if r.Level != level || !strings.Contains(r.Message, msg) {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" {
				errs = append(errs, a.Value.String())
			}
			return true
		})
	}
	return errs
}

// running is a Source running against a registry until the test ends.
type running struct {
	reg  *registry.Registry
	logs *records
}

func start(t *testing.T, c *cluster, maxAge time.Duration) running {
	t.Helper()
	logs := &records{}
	reg, err := registry.New(registry.Config{Service: "svc", Seed: 42, MaxAge: maxAge, Logger: slog.New(logs)})
	require.NoError(t, err)
	src, err := New(Config{Client: c.cs, Namespace: "ns", Service: "svc", PortName: "dtls", Logger: slog.New(logs)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, reg) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		reg.Close()
	})
	return running{reg, logs}
}

// eventually polls cond until it holds; the bound only keeps a broken
// build from hanging, it measures nothing.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r running) waitBackends(t *testing.T, want ...registry.Backend) {
	t.Helper()
	for i := range want {
		want[i].Weight = 1
	}
	eventually(t, func() bool {
		got := r.reg.Snapshot().Backends()
		return len(got) == len(want) && (len(got) == 0 || equalBackends(got, want))
	}, "backends "+format(want))
}

func equalBackends(a, b []registry.Backend) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func format(bs []registry.Backend) string {
	var sb strings.Builder
	for _, b := range bs {
		sb.WriteString(" ")
		sb.WriteString(b.Addr.String() + "/" + b.State.String())
	}
	return sb.String()
}

func TestSourceLifecycle(t *testing.T) {
	c := newCluster(t, slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.2", unready)))
	r := start(t, c, 0)

	// Initial list: a ready pod and one still starting.
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Gone))

	// ds-1 becomes ready.
	c.update(slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.2", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Ready))

	// Scale up: ds-2 lands in a second slice.
	c.create(slice("svc-b", pod("ds-2", "10.0.0.3", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Ready), be(2, "10.0.0.3:5684", registry.Ready))

	// ds-0 is terminating but still serving: draining.
	c.update(slice("svc-a", pod("ds-0", "10.0.0.1", terminating), pod("ds-1", "10.0.0.2", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Draining), be(1, "10.0.0.2:5684", registry.Ready), be(2, "10.0.0.3:5684", registry.Ready))

	// ds-0 stops serving, then is deleted.
	c.update(slice("svc-a", pod("ds-0", "10.0.0.1", terminated), pod("ds-1", "10.0.0.2", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Gone), be(1, "10.0.0.2:5684", registry.Ready), be(2, "10.0.0.3:5684", registry.Ready))
	c.update(slice("svc-a", pod("ds-1", "10.0.0.2", ready)))
	r.waitBackends(t, be(1, "10.0.0.2:5684", registry.Ready), be(2, "10.0.0.3:5684", registry.Ready))

	// The controller merges the slices: ds-2 shows up in svc-a while still in
	// svc-b, then svc-b goes. The list never changes, so nothing is published.
	version := r.reg.Snapshot().Version()
	c.update(slice("svc-a", pod("ds-1", "10.0.0.2", ready), pod("ds-2", "10.0.0.3", ready)))
	c.delete("svc-b")
	// A change after the merge proves the merge has been processed.
	c.update(slice("svc-a", pod("ds-1", "10.0.0.2", ready), pod("ds-2", "10.0.0.3", terminating)))
	r.waitBackends(t, be(1, "10.0.0.2:5684", registry.Ready), be(2, "10.0.0.3:5684", registry.Draining))
	require.Equal(t, version+1, r.reg.Snapshot().Version(), "the merge published a snapshot")
	require.Zero(t, r.reg.Stats().Rejections)

	// Scale to zero: the registry refuses an empty list, so the last
	// backends stay, all gone.
	c.delete("svc-a")
	r.waitBackends(t, be(1, "10.0.0.2:5684", registry.Gone), be(2, "10.0.0.3:5684", registry.Gone))
	require.Zero(t, r.reg.Stats().Rejections)

	// And back.
	c.create(slice("svc-a", pod("ds-0", "10.0.0.7", ready)))
	r.waitBackends(t, be(0, "10.0.0.7:5684", registry.Ready))
}

// TestSourceNoEndpointsAtStart: a Service without endpoints publishes
// nothing (the registry is empty already) and still confirms.
func TestSourceNoEndpointsAtStart(t *testing.T) {
	c := newCluster(t)
	r := start(t, c, 100*time.Millisecond)
	eventually(t, func() bool { return r.reg.Stats().Confirmations > 0 }, "a confirmation")
	require.Zero(t, r.reg.Stats().Rejections)
	require.Zero(t, r.reg.Snapshot().Version())
	c.create(slice("svc-a", pod("ds-0", "10.0.0.1", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready))
}

func TestSourceDuplicateOrdinal(t *testing.T) {
	c := newCluster(t, slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.2", ready)))
	r := start(t, c, 0)
	good := []registry.Backend{be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Ready)}
	r.waitBackends(t, good...)
	before := r.reg.Snapshot()

	// A second StatefulSet behind the same Service claims ordinal 1.
	c.create(slice("svc-b", pod("other-1", "10.0.0.9", ready)))
	eventually(t, func() bool { return r.reg.Stats().Rejections == 1 }, "a rejection")
	require.Same(t, before, r.reg.Snapshot(), "the previous snapshot stays")
	require.Equal(t, 1, r.logs.count(slog.LevelError, "rejected"))

	// More events with the same bad list: no new rejection, no new log.
	for i := range 5 {
		s := slice("svc-b", pod("other-1", "10.0.0.9", ready))
		s.Annotations = map[string]string{"touch": string(rune('a' + i))}
		c.update(s)
	}
	// Fixing the conflict publishes the good list again.
	c.delete("svc-b")
	eventually(t, func() bool { return r.reg.Snapshot() != before }, "a new snapshot")
	r.waitBackends(t, good...)
	require.Equal(t, uint64(1), r.reg.Stats().Rejections)
	require.Equal(t, 1, r.logs.count(slog.LevelError, "rejected"))
}

func TestSourceSkipLoggedOnce(t *testing.T) {
	c := newCluster(t, slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("web", "10.0.0.2", ready)))
	r := start(t, c, 0)
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready))
	for i := range 10 { // an event storm that changes nothing
		s := slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("web", "10.0.0.2", ready))
		s.Annotations = map[string]string{"touch": string(rune('a' + i))}
		c.update(s)
	}
	c.update(slice("svc-a", pod("ds-0", "10.0.0.1", terminating), pod("web", "10.0.0.2", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Draining))
	require.Equal(t, 1, r.logs.count(slog.LevelWarn, "endpoint skipped"))

	// Another skipped endpoint is a change: that one is logged.
	c.update(slice("svc-a", pod("ds-0", "10.0.0.1", terminating), pod("web", "10.0.0.2", ready), pod("ds-1", "bad", ready)))
	eventually(t, func() bool { return r.logs.count(slog.LevelWarn, "endpoint skipped") == 2 }, "one more skip log")
	// One that goes away and comes back is logged again.
	c.update(slice("svc-a", pod("ds-0", "10.0.0.1", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready))
	c.update(slice("svc-a", pod("ds-0", "10.0.0.1", terminating), pod("web", "10.0.0.2", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Draining))
	require.Equal(t, 3, r.logs.count(slog.LevelWarn, "endpoint skipped"))
}

func TestSourceUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		// Refused connections are retried inside the reflector without
		// calling the informer's watch error handler.
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}},
		{"service unavailable", apierrors.NewServiceUnavailable("apiserver restarting")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.2", unready)))
			const maxAge = 300 * time.Millisecond
			r := start(t, c, maxAge)
			r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Gone))
			// An event through the watch, so that its end below is an
			// ordinary close after which the reflector re-watches.
			c.update(slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.2", ready)))
			r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready), be(1, "10.0.0.2:5684", registry.Ready))
			// Healthy: confirmations keep the registry fresh for many MaxAges.
			confirmed := r.reg.Stats().Confirmations
			eventually(t, func() bool { return r.reg.Stats().Confirmations >= confirmed+10 }, "confirmations")
			require.False(t, r.reg.Stale())

			before := r.reg.Snapshot()
			c.fail(tc.err)
			eventually(t, r.reg.Stale, "the registry to go stale")
			require.Same(t, before, r.reg.Snapshot(), "established sessions keep their backends")
			require.Equal(t, 1, r.logs.count(slog.LevelWarn, "cannot watch"))

			// The cluster changes while the proxy cannot see it.
			c.update(slice("svc-a", pod("ds-0", "10.0.0.1", terminating), pod("ds-1", "10.0.0.2", ready)))
			require.True(t, r.reg.Stale())

			c.recover()
			eventually(t, func() bool { return !r.reg.Stale() }, "the registry to be fresh again")
			r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Draining), be(1, "10.0.0.2:5684", registry.Ready))
			eventually(t, func() bool { return r.logs.count(slog.LevelInfo, "watching EndpointSlices again") == 1 }, "the recovery log")
			require.Equal(t, 1, r.logs.count(slog.LevelWarn, "cannot watch"), "one warning per outage")
		})
	}
}

// TestSourceFailureChangesKind: within one outage, a failure of another
// kind is logged again, so that the log names what is wrong now: an API
// server that returns from a restart refusing the proxy (its RoleBinding
// was deleted while the old watch, authorized when it opened, still ran)
// must not hide behind the "connection refused" of the restart. Retries of
// the same kind stay quiet.
func TestSourceFailureChangesKind(t *testing.T) {
	c := newCluster(t, slice("svc-a", pod("ds-0", "10.0.0.1", ready)))
	r := start(t, c, 300*time.Millisecond)
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready))

	c.fail(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	eventually(t, r.reg.Stale, "the registry to go stale")
	eventually(t, func() bool { return r.logs.count(slog.LevelWarn, "cannot watch") == 1 }, "the outage's warning")

	c.fail(apierrors.NewForbidden(slicesGVR.GroupResource(), "",
		errors.New(`User "system:serviceaccount:cidroute:cidproxy" cannot list resource "endpointslices"`)))
	eventually(t, func() bool { return r.logs.count(slog.LevelWarn, "cannot watch") == 2 }, "a warning for the refusal")
	errs := r.logs.errAttrs(slog.LevelWarn, "cannot watch")
	require.Contains(t, errs[0], "connection refused")
	require.Contains(t, errs[1], "forbidden")
	// The reflector retries (0.8 s, then backing off); none is logged.
	time.Sleep(2 * time.Second)
	require.Equal(t, 2, r.logs.count(slog.LevelWarn, "cannot watch"))

	c.recover()
	eventually(t, func() bool { return !r.reg.Stale() }, "the registry to be fresh again")
	eventually(t, func() bool { return r.logs.count(slog.LevelInfo, "watching EndpointSlices again") == 1 }, "the recovery log")
}

func TestSourceRejectedListIsNotConfirmed(t *testing.T) {
	c := newCluster(t, slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("other-0", "10.0.0.2", ready)))
	r := start(t, c, 200*time.Millisecond)
	eventually(t, func() bool { return r.reg.Stats().Rejections == 1 }, "a rejection")
	eventually(t, r.reg.Stale, "the registry to go stale")
	c.update(slice("svc-a", pod("ds-0", "10.0.0.1", ready)))
	r.waitBackends(t, be(0, "10.0.0.1:5684", registry.Ready))
	eventually(t, func() bool { return !r.reg.Stale() }, "the registry to be fresh again")
}

// Two proxy replicas watching the same cluster agree on every backend and
// on the backend of every new session.
func TestReplicasAgree(t *testing.T) {
	var eps []discoveryv1.Endpoint
	for i := range 40 {
		st := ready
		switch i % 7 {
		case 3:
			st = terminating
		case 5:
			st = unready
		}
		eps = append(eps, pod("ds-"+itoa(i), "10.1.0."+itoa(i+1), st))
	}
	// Three slices, one endpoint listed twice, as during a move.
	c := newCluster(t, slice("svc-c", eps[25:]...), slice("svc-a", eps[:12]...), slice("svc-b", eps[11:25]...))
	a, b := start(t, c, 0), start(t, c, 0)

	var want []registry.Backend
	for i := range 40 {
		want = append(want, be(uint8(i), "10.1.0."+itoa(i+1)+":5684", endpointState(eps[i].Conditions)))
	}
	a.waitBackends(t, want...)
	b.waitBackends(t, want...)
	// A change seen by both.
	c.update(slice("svc-c", eps[26:]...))
	a.waitBackends(t, append(want[:25:25], want[26:]...)...)
	b.waitBackends(t, append(want[:25:25], want[26:]...)...)

	sa, sb := a.reg.Snapshot(), b.reg.Snapshot()
	require.Equal(t, sa.Backends(), sb.Backends())
	require.Positive(t, sa.Count(registry.Ready))
	key := make([]byte, 8)
	for i := range 10000 {
		binary.BigEndian.PutUint64(key, uint64(i)*0x9e3779b97f4a7c15)
		ba, oka := sa.PickNew(key)
		bb, okb := sb.PickNew(key)
		require.True(t, oka && okb)
		require.Equal(t, *ba, *bb, "key %d", i)
		require.Equal(t, registry.Ready, ba.State)
	}
}

func TestNewConfig(t *testing.T) {
	cs := fake.NewClientset()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no client", Config{Service: "svc"}},
		{"no service", Config{Client: cs}},
		{"bad service", Config{Client: cs, Service: "Svc_1"}},
		{"bad namespace", Config{Client: cs, Service: "svc", Namespace: "a/b"}},
		{"fqdn", Config{Client: cs, Service: "svc", AddressType: discoveryv1.AddressTypeFQDN}},
		{"negative confirm", Config{Client: cs, Service: "svc", ConfirmEvery: -1}},
	} {
		_, err := New(tc.cfg)
		require.ErrorIs(t, err, ErrConfig, tc.name)
	}
	s, err := New(Config{Client: cs, Service: "svc"})
	require.NoError(t, err)
	require.Equal(t, "default", s.cfg.Namespace)
	require.Error(t, s.Run(context.Background(), nil))
}

func TestNewClient(t *testing.T) {
	_, err := NewClient(t.TempDir() + "/missing")
	require.Error(t, err)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err = NewClient("")
	require.Error(t, err, "not in a cluster")
	require.False(t, errors.Is(err, ErrConfig))
}

func itoa(i int) string { return strconv.Itoa(i) }
