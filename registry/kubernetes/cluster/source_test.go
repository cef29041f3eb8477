package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/registry/kubernetes"
)

// transitionBound is what a test allows for one transition, from the API
// call that causes it to the registry showing it. The measured times are
// printed at the end of the run (go test -v); they are far below this on
// an idle machine, which leaves room for a loaded one.
const transitionBound = 10 * time.Second

// watching is the project's EndpointSlice source running in the test, as
// the cidproxy service account, against the proxies' API server.
type watching struct {
	reg *registry.Registry
	log *testtool.SyncBuffer
}

// watchSource starts a Source for the Service svc (port "dtls") into a new
// registry with freshness limit maxAge (0: off). It stops with the test.
func watchSource(t *testing.T, svc string, maxAge time.Duration) *watching {
	t.Helper()
	w := &watching{log: &testtool.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(w.log, nil))
	client, err := kubernetes.NewClient(proxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	src, err := kubernetes.New(kubernetes.Config{Client: client, Namespace: namespace, Service: svc, PortName: "dtls", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	w.reg, err = registry.New(registry.Config{Service: svc, Seed: 1, MaxAge: maxAge, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, w.reg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("source: %v", err)
		}
		w.reg.Close()
		if t.Failed() {
			t.Logf("source log:\n%s", w.log.String())
		}
	})
	return w
}

// describe writes a snapshot as "0:ready@192.0.2.10:5684 1:draining@…",
// by ordinal.
func describe(s *registry.Snapshot) string {
	var parts []string
	for _, b := range s.Backends() {
		parts = append(parts, fmt.Sprintf("%d:%v@%v", b.Ordinal, b.State, b.Addr))
	}
	return strings.Join(parts, " ")
}

// transition is one measured step: from the API call to the registry.
type transition struct {
	test, step string
	took       time.Duration
}

var transitions struct {
	sync.Mutex
	list []transition
}

// record keeps a measured transition for the summary.
func record(t *testing.T, step string, took time.Duration) {
	t.Logf("%s: %v", step, took.Round(time.Millisecond))
	transitions.Lock()
	transitions.list = append(transitions.list, transition{t.Name(), step, took})
	transitions.Unlock()
}

// printTransitions prints the measured transitions, the slowest of each
// step name first.
func printTransitions() {
	transitions.Lock()
	defer transitions.Unlock()
	if len(transitions.list) == 0 {
		return
	}
	fmt.Println("cluster: measured transitions (API call → state seen by the proxy side)")
	tw := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	for _, tr := range transitions.list {
		fmt.Fprintf(tw, "  %s\t%s\t%v\n", tr.test, tr.step, tr.took.Round(time.Millisecond))
	}
	tw.Flush()
}

// waitBackends waits until w's registry holds exactly want (describe's
// form) and records how long it took since start.
func (w *watching) waitBackends(t *testing.T, step string, start time.Time, want string) time.Duration {
	t.Helper()
	return waitFor(t, step, start, transitionBound, func() (bool, string) {
		got := describe(w.reg.Snapshot())
		return got == want, fmt.Sprintf("backends %q, want %q", got, want)
	})
}

// waitFor polls cond every 5 ms until it holds, failing the test after
// bound, and records the time since start.
func waitFor(t *testing.T, step string, start time.Time, bound time.Duration, cond func() (bool, string)) time.Duration {
	t.Helper()
	for {
		ok, why := cond()
		if ok {
			took := time.Since(start)
			record(t, step, took)
			return took
		}
		if time.Since(start) > bound {
			fatalf(t, "%s: not within %v: %s", step, bound, why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var names struct {
	sync.Mutex
	n map[string]int
}

// uniqueName returns prefix, then prefix2, prefix3, ... on later calls
// (go test -count), for Services a test creates.
func uniqueName(prefix string) string {
	names.Lock()
	defer names.Unlock()
	if names.n == nil {
		names.n = map[string]int{}
	}
	names.n[prefix]++
	if n := names.n[prefix]; n > 1 {
		return fmt.Sprintf("%s%d", prefix, n)
	}
	return prefix
}

// conditions returns the conditions the controller wrote for the pod's
// endpoint, "ready=false serving=true terminating=true", or "absent".
func conditions(t *testing.T, cp *controlPlane, svc, pod string) string {
	t.Helper()
	l, err := cp.admin.DiscoveryV1().EndpointSlices(namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + svc,
	})
	if err != nil {
		t.Fatal(err)
	}
	b := func(p *bool) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprint(*p)
	}
	for _, s := range l.Items {
		for _, ep := range s.Endpoints {
			if ep.TargetRef != nil && ep.TargetRef.Name == pod {
				c := ep.Conditions
				return fmt.Sprintf("ready=%s serving=%s terminating=%s", b(c.Ready), b(c.Serving), b(c.Terminating))
			}
		}
	}
	return "absent"
}

// wrote checks the conditions the controller wrote for pod.
func wrote(t *testing.T, cp *controlPlane, svc, pod, want string) {
	t.Helper()
	if got := conditions(t, cp, svc, pod); got != want {
		t.Errorf("the controller wrote %s for %s, want %s", got, pod, want)
	}
}

// slicesOf returns the endpoint counts of the Service's EndpointSlices as
// the controller wrote them, sorted.
func slicesOf(t *testing.T, cp *controlPlane, svc string) []int {
	t.Helper()
	l, err := cp.admin.DiscoveryV1().EndpointSlices(namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + svc,
	})
	if err != nil {
		t.Fatal(err)
	}
	var n []int
	for _, s := range l.Items {
		n = append(n, len(s.Endpoints))
	}
	slices.Sort(n)
	return n
}

// TestTransitions follows a StatefulSet-shaped set of pods through the
// states a rollout and a scale take them, with the real EndpointSlice
// controller writing the slices and the project's source reading them as
// the manifests' service account: pods become ready, a scale-up splits the
// endpoints over slices (at most 3 per slice here), a graceful delete makes
// a pod draining (its CID sessions keep their route), its Ready going false
// makes it gone, a force delete removes it, a scale-down merges the slices
// back, and the pod returns with its ordinal at a new address.
func TestTransitions(t *testing.T) {
	cp := needCluster(t)
	ctx := context.Background()
	k := kubelet{cp.admin}
	app := uniqueName("web")
	if _, err := cp.admin.CoreV1().Services(namespace).Create(ctx, headlessService(app), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := watchSource(t, app, 0)

	ip := func(ord int) string { return fmt.Sprintf("192.0.2.%d", 10+ord) }
	at := func(ord int, st registry.State) string { return fmt.Sprintf("%d:%v@%s:5684", ord, st, ip(ord)) }
	list := func(s ...string) string { return strings.Join(s, " ") }

	// Running but not ready: listed, not serving.
	start := time.Now()
	pods := map[int]types.UID{}
	for ord := range 3 {
		p := startPod(t, ctx, k, statefulPod(app, app, ord), ip(ord), false)
		pods[ord] = p.UID
	}
	w.waitBackends(t, "3 pods running, not ready → gone", start, list(at(0, registry.Gone), at(1, registry.Gone), at(2, registry.Gone)))
	wrote(t, cp, app, app+"-0", "ready=false serving=false terminating=false")

	start = time.Now()
	for ord := range 3 {
		if err := k.status(ctx, namespace, fmt.Sprintf("%s-%d", app, ord), ready(true)); err != nil {
			t.Fatal(err)
		}
	}
	w.waitBackends(t, "3 pods ready → ready", start, list(at(0, registry.Ready), at(1, registry.Ready), at(2, registry.Ready)))
	wrote(t, cp, app, app+"-0", "ready=true serving=true terminating=false")
	if got := slicesOf(t, cp, app); !slices.Equal(got, []int{3}) {
		t.Fatalf("slices %v, want one of 3 endpoints", got)
	}

	// Scale-up past the per-slice limit: the controller splits.
	start = time.Now()
	for ord := 3; ord < 5; ord++ {
		startPod(t, ctx, k, statefulPod(app, app, ord), ip(ord), true)
	}
	w.waitBackends(t, "scale-up 3 → 5 (slices split)", start, list(at(0, registry.Ready), at(1, registry.Ready), at(2, registry.Ready), at(3, registry.Ready), at(4, registry.Ready)))
	if got := slicesOf(t, cp, app); len(got) < 2 {
		t.Fatalf("slices %v, want the 5 endpoints split over at least 2", got)
	}
	t.Logf("slices after the scale-up: %v endpoints", slicesOf(t, cp, app))

	// Graceful delete of web-1: serving and terminating → draining. Its
	// CID sessions keep their route; new sessions go elsewhere.
	start = time.Now()
	if err := cp.admin.CoreV1().Pods(namespace).Delete(ctx, app+"-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitBackends(t, "graceful delete → draining", start, list(at(0, registry.Ready), at(1, registry.Draining), at(2, registry.Ready), at(3, registry.Ready), at(4, registry.Ready)))
	wrote(t, cp, app, app+"-1", "ready=false serving=true terminating=true")
	snap := w.reg.Snapshot()
	if b, ok := snap.Serving(1); !ok || b.State != registry.Draining {
		t.Fatalf("draining web-1 does not serve its CIDs: %v %v", b, ok)
	}
	for i := range 1000 {
		if b, ok := snap.PickNew(fmt.Appendf(nil, "client-%d", i)); !ok || b.Ordinal == 1 {
			t.Fatalf("a new session went to %v (ok %v); draining web-1 takes none", b, ok)
		}
	}

	// Its readiness fails (the container is exiting): not serving.
	start = time.Now()
	if err := k.status(ctx, namespace, app+"-1", ready(false)); err != nil {
		t.Fatal(err)
	}
	w.waitBackends(t, "terminating, Ready false → gone", start, list(at(0, registry.Ready), at(1, registry.Gone), at(2, registry.Ready), at(3, registry.Ready), at(4, registry.Ready)))
	wrote(t, cp, app, app+"-1", "ready=false serving=false terminating=true")
	if _, ok := w.reg.Snapshot().Serving(1); ok {
		t.Fatal("web-1 still serves its CIDs")
	}

	// The kubelet's final delete: the endpoint leaves the slices.
	start = time.Now()
	if err := k.forceDelete(ctx, namespace, app+"-1", pods[1]); err != nil {
		t.Fatal(err)
	}
	w.waitBackends(t, "force delete → removed", start, list(at(0, registry.Ready), at(2, registry.Ready), at(3, registry.Ready), at(4, registry.Ready)))
	wrote(t, cp, app, app+"-1", "absent")

	// Scale-down 5 → 3 as a StatefulSet does it, from the top: the
	// second slice empties and the endpoints are back in one.
	start = time.Now()
	for _, ord := range []int{4, 3} {
		p, err := cp.admin.CoreV1().Pods(namespace).Get(ctx, fmt.Sprintf("%s-%d", app, ord), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := k.forceDelete(ctx, namespace, p.Name, p.UID); err != nil {
			t.Fatal(err)
		}
	}
	w.waitBackends(t, "scale-down 5 → 3 (slices merge)", start, list(at(0, registry.Ready), at(2, registry.Ready)))
	waitFor(t, "slices merged", start, transitionBound, func() (bool, string) {
		got := slicesOf(t, cp, app)
		return len(got) == 1, fmt.Sprintf("slices %v", got)
	})

	// web-1 comes back, with its ordinal, at another address.
	start = time.Now()
	p := statefulPod(app, app, 1)
	startPod(t, ctx, k, p, "192.0.2.99", true)
	w.waitBackends(t, "pod recreated at a new address → ready", start,
		list(at(0, registry.Ready), "1:ready@192.0.2.99:5684", at(2, registry.Ready)))
	if !strings.Contains(w.log.String(), "kubernetes: backends updated") {
		t.Errorf("no update logged:\n%s", w.log.String())
	}
}
