package cluster

// node-a's scheduler and kubelet for the traffic tests: every pod of the
// selector is bound to node-a; a bound pod gets a sandbox (podnet_test.go)
// and its container runs as a process there, the dtls-backend binary
// with the container's args, and the pod turns Ready once the backend
// says it has started (backend.yaml has no readiness probe, so a kubelet
// reports a running container ready). A graceful delete sends SIGTERM,
// waits for the process to exit (at most the grace period, then SIGKILL),
// reports the exit and deletes the pod with grace period 0.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/cidroute/cidroute/cidkeys"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/quic"
)

// The key Secret's mount in backend.yaml and cidproxy.yaml.
const keysMount = "/etc/cidroute-keys/cid-keys.json"

// node runs the pods of one label selector.
type node struct {
	t    *testing.T
	k    kubelet
	keys string // the CID key file, where the Secret volume would be
	dir  string
	log  *testtool.SyncBuffer // what the node did, for failures

	mu    sync.Mutex
	pods  map[types.UID]*podRun
	terms []termination
	wg    sync.WaitGroup
}

// termination is one pod's graceful stop as node-a saw it.
type termination struct {
	name    string
	ordinal int
	sigterm time.Time // the kubelet saw the delete and sent SIGTERM
	exited  time.Time // the container exited
	removed time.Time // the pod was deleted from the API
}

// terminations returns the pods node-a has stopped so far.
func (n *node) terminations() []termination {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.terms)
}

// podRun is one pod's sandbox and container process.
type podRun struct {
	name, ordinal string
	uid           types.UID
	sb            *sandbox
	proc          *process
	terminating   bool
	started       time.Time
}

// startNode runs the pods matching selector in the manifests' namespace
// until the test ends; then it kills what still runs.
func startNode(t *testing.T, cp *controlPlane, selector string) *node {
	t.Helper()
	needPodNetwork(t)
	n := &node{t: t, k: kubelet{cp.admin}, keys: keysFile(t), dir: t.TempDir(), log: &testtool.SyncBuffer{}, pods: map[types.UID]*podRun{}}
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactoryWithOptions(cp.admin, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Core().V1().Pods().Informer()
	work := make(chan *corev1.Pod, 1024)
	enqueue := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			work <- p
		}
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				n.gone(p.UID)
			}
		},
	})
	factory.Start(ctx.Done())
	n.wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case p := <-work:
				n.sync(ctx, p)
			}
		}
	})
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
		n.wg.Wait()
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, r := range n.pods {
			r.proc.stop(time.Second)
			r.sb.remove()
		}
		if t.Failed() {
			t.Logf("node-a:\n%s", n.log.String())
		}
	})
	return n
}

func (n *node) logf(format string, args ...any) {
	fmt.Fprintf(n.log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// sync moves one pod on: bind it, start it, or stop it.
func (n *node) sync(ctx context.Context, p *corev1.Pod) {
	n.mu.Lock()
	r := n.pods[p.UID]
	n.mu.Unlock()
	switch {
	case p.DeletionTimestamp != nil:
		if r == nil {
			if p.Spec.NodeName != "" {
				n.k.forceDelete(ctx, p.Namespace, p.Name, p.UID)
			}
			return
		}
		n.mu.Lock()
		first := !r.terminating
		r.terminating = true
		n.mu.Unlock()
		if first {
			grace := 30 * time.Second
			if p.DeletionGracePeriodSeconds != nil {
				grace = time.Duration(*p.DeletionGracePeriodSeconds) * time.Second
			}
			n.wg.Go(func() { n.terminate(ctx, r, preStopSleep(p), grace) })
		}
	case p.Spec.NodeName == "":
		if err := n.k.bind(ctx, p); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			n.logf("bind %s: %v", p.Name, err)
		}
	case r == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed:
		if err := n.run(ctx, p); err != nil {
			n.logf("run %s: %v", p.Name, err)
			n.t.Errorf("node-a: running pod %s: %v", p.Name, err)
		}
	}
}

// run starts the pod's container in a new sandbox and reports the pod
// running; ready once the backend has started.
func (n *node) run(ctx context.Context, p *corev1.Pod) error {
	sb, err := newSandbox()
	if err != nil {
		return err
	}
	c := p.Spec.Containers[0]
	var args []string
	for _, a := range c.Args {
		args = append(args, strings.ReplaceAll(a, keysMount, n.keys))
	}
	env := append(os.Environ(), "HOSTNAME="+p.Name, "POD_NAME="+p.Name, "ORDINAL="+p.Labels["apps.kubernetes.io/pod-index"])
	bin, argv := sb.command(tools.dtlsBackend, args...)
	logPath := filepath.Join(n.dir, fmt.Sprintf("%s-%s.log", p.Name, p.UID))
	proc, err := startProcess(p.Name, logPath, env, bin, argv...)
	if err != nil {
		sb.remove()
		return err
	}
	r := &podRun{name: p.Name, ordinal: p.Labels["apps.kubernetes.io/pod-index"], uid: p.UID, sb: sb, proc: proc, started: time.Now()}
	n.mu.Lock()
	n.pods[p.UID] = r
	n.mu.Unlock()
	n.logf("%s (%s): started at %s", p.Name, p.UID, sb.ip)
	if err := n.k.status(ctx, p.Namespace, p.Name, running(sb.ip, false)); err != nil {
		return err
	}
	n.wg.Go(func() {
		for !strings.Contains(proc.tail(1<<16), "dtls-backend started") {
			if proc.exited() || ctx.Err() != nil {
				n.logf("%s: exited before it started: %s", p.Name, proc.tail(2000))
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := n.k.status(ctx, p.Namespace, p.Name, running(sb.ip, true)); err != nil && ctx.Err() == nil {
			n.logf("%s: ready: %v", p.Name, err)
			return
		}
		n.logf("%s: ready after %v", p.Name, time.Since(r.started).Round(time.Millisecond))
	})
	return nil
}

// preStopSleep is the pod's preStop sleep (its first container's), which
// a kubelet runs before SIGTERM, within the grace period.
func preStopSleep(p *corev1.Pod) time.Duration {
	if len(p.Spec.Containers) == 0 {
		return 0
	}
	l := p.Spec.Containers[0].Lifecycle
	if l == nil || l.PreStop == nil || l.PreStop.Sleep == nil {
		return 0
	}
	return time.Duration(l.PreStop.Sleep.Seconds) * time.Second
}

// terminate stops the pod's container as a kubelet does at a graceful
// delete: the preStop sleep, then SIGTERM, then SIGKILL when the grace
// period is over; it reports the exit and deletes the pod.
func (n *node) terminate(ctx context.Context, r *podRun, preStop, grace time.Duration) {
	start := time.Now()
	select {
	case <-time.After(min(preStop, grace)):
	case <-ctx.Done():
		return
	}
	grace -= time.Since(start)
	t0 := time.Now()
	r.proc.signal(syscall.SIGTERM)
	select {
	case <-r.proc.done:
	case <-time.After(grace):
		n.logf("%s: grace period %v over: SIGKILL", r.name, grace)
		r.proc.cmd.Process.Kill()
		<-r.proc.done
	case <-ctx.Done():
		return
	}
	exitedAt := time.Now()
	n.logf("%s: exited %v after SIGTERM (%v)", r.name, exitedAt.Sub(t0).Round(time.Millisecond), r.proc.err)
	if err := n.k.status(ctx, namespace, r.name, exited); err != nil && ctx.Err() == nil {
		n.logf("%s: exit status: %v", r.name, err)
	}
	if err := n.k.forceDelete(ctx, namespace, r.name, r.uid); err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		n.logf("%s: delete: %v", r.name, err)
	}
	ord, _ := strconv.Atoi(r.ordinal)
	n.mu.Lock()
	n.terms = append(n.terms, termination{name: r.name, ordinal: ord, sigterm: t0, exited: exitedAt, removed: time.Now()})
	n.mu.Unlock()
	n.gone(r.uid)
}

// gone forgets a pod that has left the API: its process and sandbox go.
func (n *node) gone(uid types.UID) {
	n.mu.Lock()
	r := n.pods[uid]
	delete(n.pods, uid)
	n.mu.Unlock()
	if r == nil {
		return
	}
	r.proc.stop(time.Second)
	r.sb.remove()
}

// backendLogs returns the logs of every backend process the node ran.
func (n *node) backendLogs() string {
	files, _ := filepath.Glob(filepath.Join(n.dir, "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "== %s\n%s", filepath.Base(f), data)
	}
	return b.String()
}

var keys struct {
	sync.Mutex
	path  string
	codec *quic.LBEncrypted // the file's keys, to read ordinals from CIDs
}

// keysFile writes the example Secret's cid-keys.json (cid-keys.yaml) once,
// 0400 as the Secret volume's defaultMode, and returns its path.
func keysFile(t *testing.T) string {
	t.Helper()
	keys.Lock()
	defer keys.Unlock()
	if keys.path != "" {
		return keys.path
	}
	objs, err := readManifest("cid-keys.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "Secret" {
			continue
		}
		data, _, _ := unstructured.NestedString(o.Object, "stringData", "cid-keys.json")
		if data == "" {
			break
		}
		p := filepath.Join(cluster.dir, "cid-keys.json")
		if err := os.WriteFile(p, []byte(data), 0o400); err != nil {
			t.Fatal(err)
		}
		// The proxies' cid_length 8: 6 nonce octets.
		f, err := cidkeys.Open(context.Background(), p, 6)
		if err != nil {
			t.Fatal(err)
		}
		keys.path, keys.codec = p, f.Codec()
		return p
	}
	t.Fatal("cid-keys.yaml: no Secret with stringData cid-keys.json")
	return ""
}
