package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cidroute/cidroute/hrw"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/registry/kubernetes"
)

// podReplica is one proxy replica's Pod-watching source and registry.
type podReplica struct {
	src *kubernetes.Source
	reg *registry.Registry
	log *testtool.SyncBuffer
}

// grantPods adds the Role rule docs/kubernetes.md gives for watch_pods
// (list and watch on pods) to the cidproxy service account, for the test.
func grantPods(t *testing.T, cp *controlPlane) {
	t.Helper()
	ctx := context.Background()
	name := uniqueName("cidproxy-pods")
	rb := cp.admin.RbacV1()
	if _, err := rb.Roles(namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rb.RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "cidproxy", Namespace: namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rb.RoleBindings(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		rb.Roles(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func watchPods(t *testing.T, svc string) *podReplica {
	t.Helper()
	r := &podReplica{log: &testtool.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(r.log, nil))
	client, err := kubernetes.NewClient(proxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	r.src, err = kubernetes.New(kubernetes.Config{Client: client, Namespace: namespace, Service: svc, PortName: "dtls", Logger: log,
		WatchPods: true, PodSelector: "app.kubernetes.io/name=" + svc})
	if err != nil {
		t.Fatal(err)
	}
	r.reg, err = registry.New(registry.Config{Service: svc, Seed: 1, SlowStart: time.Hour, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.src.Run(ctx, r.reg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("source: %v", err)
		}
		r.reg.Close()
		if t.Failed() {
			t.Logf("source log:\n%s", r.log.String())
		}
	})
	return r
}

// weights describes the ready backends' weights and permille: "0:3/1000 1:1/100".
func weights(s *registry.Snapshot) string {
	out := ""
	for _, b := range s.Backends() {
		if b.State == registry.Ready {
			out += fmt.Sprintf("%d:%d/%d ", b.Ordinal, b.Weight, s.Permille(b.Ordinal))
		}
	}
	return out
}

// TestPodWeightsAndSkew runs two replicas' sources with watch_pods as the
// manifests' service account, with the documented extra rule, against
// the real controllers: the Pods' weight annotations and Ready times reach
// both registries, a refused annotation leaves weight 1, and a pod that
// just became ready slow-starts from its Pod's Ready time on both, with
// identical tables. Each change is timed from the API call to each
// replica, and the difference between the two replicas is the skew
// docs/kubernetes.md reports.
func TestPodWeightsAndSkew(t *testing.T) {
	cp := needCluster(t)
	ctx := context.Background()
	k := kubelet{cp.admin}
	grantPods(t, cp)
	app := uniqueName("weights")
	if _, err := cp.admin.CoreV1().Services(namespace).Create(ctx, headlessService(app), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Both pods ready an hour ago, as far as slow start is concerned: the
	// kubelet's Ready time is backdated.
	for ord := range 2 {
		p := statefulPod(app, app, ord)
		if ord == 0 {
			p.Annotations = map[string]string{kubernetes.DefaultWeightAnnotation: "3"}
		}
		startPod(t, ctx, k, p, fmt.Sprintf("192.0.2.%d", 40+ord), true)
		if err := k.status(ctx, namespace, p.Name, func(p *corev1.Pod) {
			for i := range p.Status.Conditions {
				p.Status.Conditions[i].LastTransitionTime = metav1.NewTime(time.Now().Add(-time.Hour))
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := watchPods(t, app), watchPods(t, app)

	var skews []time.Duration
	// both waits until each replica shows want, and records the latency
	// to each and the skew between them.
	both := func(step string, start time.Time, want string) {
		t.Helper()
		var seen [2]time.Duration
		for seen[0] == 0 || seen[1] == 0 {
			for i, r := range []*podReplica{a, b} {
				if seen[i] == 0 && weights(r.reg.Snapshot()) == want {
					seen[i] = time.Since(start)
				}
			}
			if time.Since(start) > transitionBound {
				fatalf(t, "%s: not within %v: replica A %q, B %q, want %q", step, transitionBound,
					weights(a.reg.Snapshot()), weights(b.reg.Snapshot()), want)
			}
			time.Sleep(time.Millisecond)
		}
		record(t, step+" (replica A)", seen[0])
		record(t, step+" (replica B)", seen[1])
		skews = append(skews, (seen[0] - seen[1]).Abs())
	}
	both("annotated weights", time.Now(), "0:3/1000 1:1/1000 ")

	// Re-weigh ds-1 a few times: each is one Pod update.
	for _, w := range []string{"2", "5", "1", "4"} {
		start := time.Now()
		if err := k.annotate(ctx, app+"-1", w); err != nil {
			t.Fatal(err)
		}
		both("weight of pod 1 → "+w, start, "0:3/1000 1:"+w+"/1000 ")
	}

	// A refused value: weight 1, counted once.
	start := time.Now()
	if err := k.annotate(ctx, app+"-1", "0"); err != nil {
		t.Fatal(err)
	}
	both("weight of pod 1 → 0, refused", start, "0:3/1000 1:1/1000 ")
	if a.src.BadWeights() != 1 || b.src.BadWeights() != 1 {
		t.Errorf("refused weights counted %d and %d, want 1 each", a.src.BadWeights(), b.src.BadWeights())
	}

	// A third pod becomes ready now: it slow-starts on both replicas from
	// its Pod's Ready time, and both pick alike for every key.
	start = time.Now()
	startPod(t, ctx, k, statefulPod(app, app, 2), "192.0.2.42", true)
	both("pod 2 ready → slow start", start, "0:3/1000 1:1/1000 2:1/100 ")
	p, err := cp.admin.CoreV1().Pods(namespace).Get(ctx, app+"-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var readyAt time.Time
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			readyAt = c.LastTransitionTime.UTC()
		}
	}
	for _, r := range []*podReplica{a, b} {
		be, _ := r.reg.Snapshot().Backend(2)
		if !be.ReadySince.Equal(readyAt) {
			t.Errorf("ReadySince %v, want the Pod's Ready time %v", be.ReadySince, readyAt)
		}
	}
	var oa, ob [hrw.Buckets]uint8
	a.reg.Snapshot().Table().Owners(&oa)
	b.reg.Snapshot().Table().Owners(&ob)
	if oa != ob {
		t.Error("the two replicas' tables differ")
	}
	var worst time.Duration
	for _, s := range skews {
		worst = max(worst, s)
	}
	t.Logf("replica skew over %d changes: worst %v (all: %v)", len(skews), worst.Round(time.Millisecond), skews)
	record(t, "replica skew, worst of the changes", worst)
}

// annotate sets the weight annotation of a pod, as an operator's kubectl
// annotate --overwrite does.
func (k kubelet) annotate(ctx context.Context, name, weight string) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, kubernetes.DefaultWeightAnnotation, weight)
	_, err := k.c.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}
