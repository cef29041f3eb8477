package cluster

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cidroute/cidroute/internal/testtool"
)

// The test binary's shared state, set up by TestMain.
var (
	tools   toolset
	cluster *controlPlane
	// skipWhy says why the cluster tests skip (tools could not be built
	// and CIDROUTE_REQUIRE_TOOLS is not 1); "" when they run.
	skipWhy string
	// ownNetns: the binary runs in a network namespace of its own (root,
	// unshare and ip available), where the traffic tests give pods
	// network namespaces and addresses of their own.
	ownNetns bool
	// proxyKubeconfig authenticates as the manifests' cidproxy service
	// account against the proxies' API server.
	proxyKubeconfig string
)

// Paths of the repository and its example manifests.
const (
	repoRoot     = "../../.."
	manifestsDir = repoRoot + "/examples/kubernetes"
	namespace    = "cidroute" // the manifests' namespace
	nodeName     = "node-a"
)

// childEnv marks the copy of the test binary that runs in a network
// namespace of its own; its value is the directory of the built tools.
const childEnv = "CIDROUTE_CLUSTER_CHILD"

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	if dir := os.Getenv(childEnv); dir != "" {
		tools = toolsIn(dir)
		ownNetns = true
		if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "cluster: ip link set lo up: %v: %s\n", err, out)
			return 1
		}
	} else {
		t0 := time.Now()
		ts, err := buildTools()
		if err != nil {
			if testtool.Required() {
				fmt.Fprintf(os.Stderr, "cluster: building the control plane failed and CIDROUTE_REQUIRE_TOOLS=1: %v\n", err)
				return 1
			}
			skipWhy = fmt.Sprintf("building the control plane failed: %v (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)", err)
			return m.Run()
		}
		fmt.Printf("cluster: tools built (or found up to date) in %v: %s\n", time.Since(t0).Round(100*time.Millisecond), ts.dir)
		tools = ts
		if canUnshare() {
			return reexec(ts.dir)
		}
	}

	dir, err := os.MkdirTemp("", "cidroute-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		return 1
	}
	cp, err := startControlPlane(dir, tools.kubecp)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster: starting the control plane: %v\n(logs in %s)\n", err, dir)
		return 1
	}
	fmt.Printf("cluster: etcd, 2 kube-apiservers and kube-controller-manager ready in %v (logs in %s)\n", cp.started.Round(10*time.Millisecond), dir)
	cluster = cp
	if err := setUp(cp); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: setting up: %v\n", err)
		cp.stop()
		return 1
	}
	code := m.Run()
	printTransitions()
	if err := cp.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: stopping the control plane: %v\n", err)
	}
	stopPodNetwork()
	if code == 0 {
		os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "cluster: logs kept in %s\n", dir)
	}
	return code
}

// needCluster returns the running control plane, or skips the test. It
// is each test's first call, so the cleanup it registers runs last: it
// repeats the test's failed checks (errorf, fatalf) after the node's and
// the proxy's log dumps, so that a CI page showing the end of a failing
// test's output still says what failed.
func needCluster(t *testing.T) *controlPlane {
	t.Helper()
	if cluster == nil {
		t.Skip(skipWhy)
	}
	var failed []string
	failures.Store(t, &failed)
	t.Cleanup(func() {
		failures.Delete(t)
		for _, m := range failed {
			t.Log("failed (again, after the logs): " + m)
		}
	})
	return cluster
}

// failures holds the failed checks of each running cluster test.
var failures sync.Map // *testing.T → *[]string

// errorf fails the test with a check that needCluster repeats at its end.
func errorf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Error(noteFailure(t, format, args))
}

// fatalf is errorf that stops the test.
func fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatal(noteFailure(t, format, args))
}

func noteFailure(t *testing.T, format string, args []any) string {
	msg := fmt.Sprintf(format, args...)
	if p, ok := failures.Load(t); ok {
		m := p.(*[]string)
		*m = append(*m, msg)
	}
	return msg
}

// canUnshare reports whether the binary can move into a network namespace
// of its own.
func canUnshare() bool {
	if os.Geteuid() != 0 {
		return false
	}
	for _, p := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(p); err != nil {
			return false
		}
	}
	// Root in a container may still lack CAP_SYS_ADMIN.
	return exec.Command("unshare", "--net", "--", "true").Run() == nil
}

// reexec runs this test binary again, with the same flags, in a network
// namespace of its own, and returns its exit code. Its control plane,
// proxies and pods then see only that namespace's loopback and the
// links it makes: no port or route of the machine is touched.
func reexec(toolsDir string) int {
	cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), childEnv+"="+toolsDir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "cluster: unshare:", err)
		return 1
	}
	return 0
}

// toolset is the programs the tests run, built from this repository.
type toolset struct {
	dir         string
	kubecp      string // cmd/kubecp: etcd, kube-apiserver, kube-controller-manager
	cidproxy    string // examples/kubernetes/cidproxy
	dtlsBackend string // examples/dtls-backend
}

func toolsIn(dir string) toolset {
	return toolset{
		dir:         dir,
		kubecp:      filepath.Join(dir, "kubecp"),
		cidproxy:    filepath.Join(dir, "cidproxy"),
		dtlsBackend: filepath.Join(dir, "dtls-backend"),
	}
}

// buildTools builds the programs into a cache directory that outlives the
// run ($CIDROUTE_CLUSTER_CACHE, else the user cache directory), one per
// checkout. go build relinks a binary only when its inputs changed, so a
// warm run takes seconds; the cold one compiles Kubernetes (minutes).
func buildTools() (toolset, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return toolset{}, fmt.Errorf("no go on PATH: %w", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		return toolset{}, err
	}
	cache := os.Getenv("CIDROUTE_CLUSTER_CACHE")
	if cache == "" {
		uc, err := os.UserCacheDir()
		if err != nil {
			return toolset{}, err
		}
		cache = filepath.Join(uc, "cidroute-cluster")
	}
	sum := sha256.Sum256([]byte(root))
	ts := toolsIn(filepath.Join(cache, fmt.Sprintf("%x", sum[:6])))
	if err := os.MkdirAll(ts.dir, 0o755); err != nil {
		return toolset{}, err
	}
	here, err := os.Getwd()
	if err != nil {
		return toolset{}, err
	}
	// The upstream mains get their version from the release's linker
	// flags; without them the servers call themselves v0.0.0.
	out, err := goEnv(here, false, gobin, "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes").Output()
	if err != nil {
		return toolset{}, fmt.Errorf("go list -m k8s.io/kubernetes: %w", err)
	}
	kv := strings.TrimSpace(string(out))
	var major, minor string
	if _, err := fmt.Sscanf(strings.ReplaceAll(strings.TrimPrefix(kv, "v"), ".", " "), "%s %s", &major, &minor); err != nil {
		return toolset{}, fmt.Errorf("k8s.io/kubernetes version %q: %w", kv, err)
	}
	ldflags := fmt.Sprintf("-X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=%s -X k8s.io/component-base/version.gitMinor=%s -X k8s.io/component-base/version.gitTreeState=clean",
		kv, major, minor)
	for _, b := range []struct {
		out, dir, pkg string
		workspace     bool
		flags         []string
	}{
		// This module: never in go.work (see go.mod).
		{ts.kubecp, here, "./cmd/kubecp", false, []string{"-ldflags", ldflags}},
		// The repository's own modules, with the workspace as every
		// other test builds them.
		{ts.cidproxy, filepath.Join(root, "examples/kubernetes/cidproxy"), ".", true, nil},
		{ts.dtlsBackend, filepath.Join(root, "examples"), "./dtls-backend", true, nil},
	} {
		args := append(append([]string{"build", "-o", b.out}, b.flags...), b.pkg)
		cmd := goEnv(b.dir, b.workspace, gobin, args...)
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return toolset{}, fmt.Errorf("go build %s in %s: %w\n%s", b.pkg, b.dir, err, out)
		}
		fmt.Printf("cluster: go build %s: %v\n", filepath.Base(b.out), time.Since(t0).Round(100*time.Millisecond))
	}
	return ts, nil
}

// goEnv is a go command in dir, with the workspace or with GOWORK=off.
func goEnv(dir string, workspace bool, gobin string, args ...string) *exec.Cmd {
	cmd := exec.Command(gobin, args...)
	cmd.Dir = dir
	cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "GOWORK=") })
	if !workspace {
		cmd.Env = append(cmd.Env, "GOWORK=off")
	}
	return cmd
}

// setUp makes what every test shares: the node the pods are bound to,
// the manifests' namespace and RBAC (applied from their files), and a
// kubeconfig for the cidproxy service account on the proxies' API
// server.
func setUp(cp *controlPlane) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if _, err := cp.admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, f := range []string{"namespace.yaml", "rbac.yaml", "cid-keys.yaml"} {
		if _, err := applyFile(ctx, cp, f, nil); err != nil {
			return err
		}
	}
	// The ServiceAccount admission plugin wants each pod's account, and
	// the service account controller makes "default" shortly after the
	// namespace.
	for {
		_, err := cp.admin.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || ctx.Err() != nil {
			return fmt.Errorf("waiting for the default service account: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A bound token for the manifests' service account, as the kubelet
	// would project into the cidproxy pod.
	exp := int64(24 * 3600)
	tr, err := cp.admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "cidproxy",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for the cidproxy service account: %w", err)
	}
	proxyKubeconfig = filepath.Join(cp.dir, "cidproxy.kubeconfig")
	return os.WriteFile(proxyKubeconfig, cp.kubeconfig(cp.proxy, tr.Status.Token), 0o600)
}
