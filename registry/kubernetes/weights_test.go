package kubernetes

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cidroute/cidroute/registry"
)

var readyAt = time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)

// backendPod is the Pod behind an endpoint: its weight annotation ("" for
// none) and, when ready is set, a Ready condition since then.
func backendPod(name, weight string, ready time.Time) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{"app": "ds"}}}
	if weight != "" {
		p.Annotations = map[string]string{DefaultWeightAnnotation: weight, "other": "x"}
	}
	st := corev1.ConditionFalse
	if !ready.IsZero() {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(readyAt.Add(-time.Hour))},
		{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.NewTime(ready)},
	}
	return p
}

// The mapper reads weights and ready times from the Pods: a valid
// annotation is the weight, a refused one (out of range, not a number)
// leaves 1 and is reported, a missing one is 1; a ready endpoint's
// ReadySince is its Pod's Ready time, or pendingReady while the cache has
// no ready Pod for it; a draining one has none.
func TestPodWeights(t *testing.T) {
	pods := map[string]*corev1.Pod{}
	for _, p := range []*corev1.Pod{
		backendPod("ds-0", "3", readyAt),
		backendPod("ds-1", "0", readyAt),
		backendPod("ds-2", "10001", readyAt),
		backendPod("ds-3", "two", readyAt),
		backendPod("ds-4", "", readyAt.Add(time.Minute)),
		backendPod("ds-5", "10000", time.Time{}), // the cache lags: not ready yet
		backendPod("ds-7", "2", readyAt),
	} {
		pods[p.Name] = trimPod(p, DefaultWeightAnnotation)
	}
	m := mapper{service: "svc", portName: "dtls", weightKey: DefaultWeightAnnotation,
		pod: func(name string) *corev1.Pod { return pods[name] }}
	bs, skips, bad := m.backends([]*discoveryv1.EndpointSlice{slice("svc-a",
		pod("ds-0", "10.0.0.0", ready), pod("ds-1", "10.0.0.1", ready), pod("ds-2", "10.0.0.2", ready),
		pod("ds-3", "10.0.0.3", ready), pod("ds-4", "10.0.0.4", ready), pod("ds-5", "10.0.0.5", ready),
		pod("ds-6", "10.0.0.6", ready), pod("ds-7", "10.0.0.7", terminating))})
	require.Empty(t, skips)
	b := func(ord uint8, w uint32, since time.Time, st registry.State) registry.Backend {
		x := be(ord, "10.0.0."+string(rune('0'+ord))+":5684", st)
		x.Weight, x.ReadySince = w, since
		return x
	}
	require.Equal(t, []registry.Backend{
		b(0, 3, readyAt, registry.Ready),
		b(1, 0, readyAt, registry.Ready),
		b(2, 0, readyAt, registry.Ready),
		b(3, 0, readyAt, registry.Ready),
		b(4, 0, readyAt.Add(time.Minute), registry.Ready),
		b(5, 10000, pendingReady, registry.Ready),
		b(6, 0, pendingReady, registry.Ready), // no Pod in the cache
		b(7, 2, time.Time{}, registry.Draining),
	}, bs)
	require.Len(t, bad, 3)
	require.Equal(t, "ds-1", bad[0].endpoint)
	require.Equal(t, `cidroute.io/weight "0" is not a weight: want an integer 1-10000; using 1`, bad[0].reason)
	require.Equal(t, `cidroute.io/weight "two" is not a weight: want an integer 1-10000; using 1`, bad[2].reason)

	// Without WatchPods nothing of the Pods is read.
	m.pod = nil
	bs, _, bad = m.backends([]*discoveryv1.EndpointSlice{slice("svc-a", pod("ds-0", "10.0.0.0", ready))})
	require.Equal(t, []registry.Backend{be(0, "10.0.0.0:5684", registry.Ready)}, bs)
	require.Empty(t, bad)

	// The cache keeps only what the mapper reads.
	tp := pods["ds-0"]
	require.Equal(t, map[string]string{DefaultWeightAnnotation: "3"}, tp.Annotations)
	require.Len(t, tp.Status.Conditions, 1)
	require.Nil(t, tp.Labels)
}

// The source with WatchPods against a fake API server: weights and ready
// times reach the registry, a weight change is published, a refused
// annotation is logged once and counted, and the registry's slow start
// ramps the backend whose Pod just became ready.
func TestSourceWatchesPods(t *testing.T) {
	c := newCluster(t,
		backendPod("ds-0", "", readyAt.Add(-time.Hour)),
		backendPod("ds-1", "2", readyAt.Add(-time.Hour)),
		backendPod("ds-2", "many", readyAt.Add(-time.Hour)),
		backendPod("web", "9", readyAt), // not selected
	)
	s := slice("svc-a", pod("ds-0", "10.0.0.1", ready), pod("ds-1", "10.0.0.2", ready), pod("ds-2", "10.0.0.3", ready))
	c.create(s)
	logs := &records{}
	reg, err := registry.New(registry.Config{Service: "svc", Seed: 42, SlowStart: time.Hour, Logger: slog.New(logs)})
	require.NoError(t, err)
	defer reg.Close()
	src, err := New(Config{Client: c.cs, Namespace: "ns", Service: "svc", PortName: "dtls", Logger: slog.New(logs),
		WatchPods: true, PodSelector: "app=ds"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, reg) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	weights := func() map[uint8]uint32 {
		w := map[uint8]uint32{}
		for _, b := range reg.Snapshot().Backends() {
			w[b.Ordinal] = b.Weight
		}
		return w
	}
	eventually(t, func() bool { return len(weights()) == 3 }, "the first list")
	require.Equal(t, map[uint8]uint32{0: 1, 1: 2, 2: 1}, weights())
	require.Equal(t, uint64(1), src.BadWeights())
	require.Equal(t, 1, logs.count(slog.LevelWarn, "weight annotation refused"))
	require.Zero(t, reg.Snapshot().SlowStarting(), "ready an hour ago")

	// An operator re-weighs ds-0.
	p := backendPod("ds-0", "5", readyAt.Add(-time.Hour))
	_, err = c.cs.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(t, func() bool { return weights()[0] == 5 }, "the new weight")
	require.Equal(t, uint64(1), src.BadWeights(), "the refused annotation is counted once while it lasts")

	// A new pod becomes ready now: it slow-starts from its Pod's Ready time.
	now := time.Now().UTC().Truncate(time.Second)
	_, err = c.cs.CoreV1().Pods("ns").Create(context.Background(), backendPod("ds-3", "", now), metav1.CreateOptions{})
	require.NoError(t, err)
	s.Endpoints = append(s.Endpoints, pod("ds-3", "10.0.0.4", ready))
	c.update(s)
	eventually(t, func() bool { b, ok := reg.Snapshot().Backend(3); return ok && b.ReadySince.Equal(now) }, "ds-3 with its ready time")
	require.Equal(t, uint16(100), reg.Snapshot().Permille(3))
	require.Equal(t, 1, reg.Stats().SlowStarting)
}

func TestPodConfigErrors(t *testing.T) {
	c := newCluster(t)
	for _, cfg := range []Config{
		{WeightAnnotation: "not a key!"},
		{WatchPods: true, PodSelector: "app in (("},
		{PodSelector: "app=ds"}, // without WatchPods
	} {
		cfg.Client, cfg.Service = c.cs, "svc"
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrConfig, "%+v", cfg)
	}
}
