package cluster

// The control plane: etcd, two kube-apiservers on it and a
// kube-controller-manager, each a process of the kubecp binary
// (cmd/kubecp), on free loopback ports, stopped through their own process
// handles.
//
// Two API servers, as in an HA control plane: "proxy" serves the
// identities under test (the cidproxy service account), "control" serves
// the controller manager and the test's own admin and kubelet. A test can
// stop the proxies' API server while the controller goes on writing
// EndpointSlices through the other one, which is how an outage of the
// server a proxy happens to watch looks, and how history moves on while a
// watcher is away.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Static tokens of the identities that are not service accounts.
const (
	adminToken = "cidroute-admin-token" // the test: system:masters
	kcmToken   = "cidroute-kcm-token"   // kube-controller-manager: system:masters
	issuer     = "https://kubernetes.default.svc.cluster.local"
)

// maxEndpointsPerSlice is the controller's per-slice limit, low so that a
// handful of pods splits a Service's endpoints over several slices.
const maxEndpointsPerSlice = 3

// A process is one program of the control plane (or a proxy, a backend)
// started by a test, with its output in a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProcess starts bin with args, its stdout and stderr appended to
// logPath. env, when set, replaces the environment.
func startProcess(name, logPath string, env []string, bin string, args ...string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = env
	// Its own process group, so that a test's ^C reaches the test first and
	// the harness stops its children itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process (not its group).
func (p *process) signal(sig syscall.Signal) {
	if !p.exited() {
		p.cmd.Process.Signal(sig)
	}
}

// stop ends the process: SIGTERM, and SIGKILL after grace. It returns the
// process's exit error, nil for a clean exit or one by SIGTERM.
func (p *process) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	return p.err
}

// kill ends the process with SIGKILL and waits for it. It returns nil
// when the process ended by that kill.
func (p *process) kill() error {
	if p == nil {
		return nil
	}
	if !p.exited() {
		p.cmd.Process.Kill()
	}
	<-p.done
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return nil
		}
	}
	return p.err
}

// tail returns the last n bytes of the process's log.
func (p *process) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// apiServer is one kube-apiserver process and what restarts it.
type apiServer struct {
	name  string
	port  uint16
	args  []string
	extra []string // flags of the next start on top of args
	bin   string
	dir   string
	proc  *process
}

func (a *apiServer) url() string { return fmt.Sprintf("https://127.0.0.1:%d", a.port) }

// auditLog is where this API server records the cidproxy identity's
// EndpointSlice requests.
func (a *apiServer) auditLog() string { return filepath.Join(a.dir, a.name+"-audit.log") }

// start starts the API server and waits until it is ready.
func (a *apiServer) start(ca []byte) error {
	args := append(slices.Clip(a.args), a.extra...)
	p, err := startProcess("kube-apiserver "+a.name, filepath.Join(a.dir, a.name+".log"), nil, a.bin, args...)
	if err != nil {
		return err
	}
	a.proc = p
	if err := waitReady(p, a.url()+"/readyz", ca, adminToken, 90*time.Second); err != nil {
		p.stop(5 * time.Second)
		return fmt.Errorf("kube-apiserver %s: %w\n%s", a.name, err, p.tail(4000))
	}
	return nil
}

// stop kills the API server process, as a crash or an OOM kill would: its
// sockets close at once and its clients see their connections reset. (A
// SIGTERM starts a graceful shutdown that stops listening at once but
// keeps the process, and its open watches, for up to a minute.)
func (a *apiServer) stop() error { return a.proc.kill() }

// ensureUp starts the API server again if a test that stopped it ended
// before it did.
func (a *apiServer) ensureUp(t *testing.T, ca []byte) {
	t.Cleanup(func() {
		if a.proc.exited() {
			a.extra = nil
			if err := a.start(ca); err != nil {
				t.Error(err)
			}
		}
	})
}

// restart stops the API server and starts it again with extra flags on
// top of its own.
func (a *apiServer) restart(ca []byte, extra ...string) error {
	if err := a.stop(); err != nil {
		return fmt.Errorf("kube-apiserver %s: %w", a.name, err)
	}
	a.extra = extra
	return a.start(ca)
}

// controlPlane is the running cluster of a test binary.
type controlPlane struct {
	dir     string
	bin     string // kubecp
	caPEM   []byte
	etcdURL string
	etcd    *process
	proxy   *apiServer // the server the proxies' identity talks to
	control *apiServer // the controller manager's and the test's
	kcm     *process
	admin   *k8s.Clientset // on control
	started time.Duration  // how long start took
}

// startControlPlane generates the credentials and starts etcd, both API
// servers and the controller manager under dir. On error what started is
// stopped again.
func startControlPlane(dir, bin string) (cp *controlPlane, err error) {
	t0 := time.Now()
	cp = &controlPlane{dir: dir, bin: bin}
	defer func() {
		if err != nil {
			cp.stop()
			cp = nil
		}
	}()
	if err := cp.writeCredentials(); err != nil {
		return nil, err
	}
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	cp.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	cp.etcd, err = startProcess("etcd", filepath.Join(dir, "etcd.log"), nil, bin, "etcd",
		"-data-dir", filepath.Join(dir, "etcd"), "-listen-client", cp.etcdURL,
		"-listen-peer", fmt.Sprintf("http://127.0.0.1:%d", ports[1]))
	if err != nil {
		return nil, err
	}
	if err := waitEtcd(cp.etcd, cp.etcdURL, 60*time.Second); err != nil {
		return nil, err
	}

	cp.proxy = cp.apiServer("proxy", ports[2])
	cp.control = cp.apiServer("control", ports[3])
	for _, a := range []*apiServer{cp.control, cp.proxy} {
		if err := a.start(cp.caPEM); err != nil {
			return nil, err
		}
	}
	cp.admin, err = k8s.NewForConfig(cp.restConfig(cp.control, adminToken))
	if err != nil {
		return nil, err
	}

	kubeconfig := filepath.Join(dir, "kcm.kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.kubeconfig(cp.control, kcmToken), 0o600); err != nil {
		return nil, err
	}
	cp.kcm, err = startProcess("kube-controller-manager", filepath.Join(dir, "kcm.log"), nil, bin, "kube-controller-manager",
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(int(ports[4])),
		"--cert-dir="+filepath.Join(dir, "kcm-certs"),
		"--leader-elect=false",
		// The EndpointSlice controller under test; the service account
		// controller makes each namespace's "default" account, which the
		// ServiceAccount admission plugin wants for every pod; the
		// StatefulSet controller runs the rolling replacement.
		"--controllers=endpointslice-controller,serviceaccount-controller,statefulset-controller",
		"--max-endpoints-per-slice="+strconv.Itoa(maxEndpointsPerSlice),
		"--service-account-private-key-file="+filepath.Join(dir, "sa.key"),
		"--root-ca-file="+filepath.Join(dir, "ca.crt"),
	)
	if err != nil {
		return nil, err
	}
	if err := waitReady(cp.kcm, fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[4]), nil, kcmToken, 60*time.Second); err != nil {
		return nil, fmt.Errorf("kube-controller-manager: %w\n%s", err, cp.kcm.tail(4000))
	}
	cp.started = time.Since(t0)
	return cp, nil
}

// apiServer returns the flags of one API server; it does not start it.
func (cp *controlPlane) apiServer(name string, port uint16) *apiServer {
	d := cp.dir
	a := &apiServer{name: name, port: port, bin: cp.bin, dir: d}
	a.args = []string{"kube-apiserver",
		"--etcd-servers=" + cp.etcdURL,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(int(port)),
		// With a loopback advertise address the endpoint reconciler of the
		// "kubernetes" Service would write a loopback endpoint, which the
		// API refuses.
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(d, name+"-certs"),
		"--tls-cert-file=" + filepath.Join(d, "serving.crt"), "--tls-private-key-file=" + filepath.Join(d, "serving.key"),
		"--client-ca-file=" + filepath.Join(d, "ca.crt"),
		"--token-auth-file=" + filepath.Join(d, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + issuer,
		"--service-account-key-file=" + filepath.Join(d, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(d, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--audit-policy-file=" + filepath.Join(d, "audit-policy.yaml"),
		"--audit-log-path=" + a.auditLog(), "--audit-log-format=json",
		"--profiling=false",
	}
	return a
}

// restConfig is a client config for the API server a with a bearer token.
func (cp *controlPlane) restConfig(a *apiServer, token string) *rest.Config {
	return &rest.Config{
		Host:            a.url(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS:             100, Burst: 200,
	}
}

// kubeconfig is a kubeconfig file for a with a bearer token.
func (cp *controlPlane) kubeconfig(a *apiServer, token string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: %q, certificate-authority-data: %q}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: local, context: {cluster: local, user: u}}]
current-context: local
`, a.url(), base64.StdEncoding.EncodeToString(cp.caPEM), token)
}

// stop stops the controller manager, the API servers and etcd, in that
// order, and returns their exit errors.
func (cp *controlPlane) stop() error {
	var errs []error
	if cp.kcm != nil {
		errs = append(errs, cp.kcm.stop(10*time.Second))
	}
	for _, a := range []*apiServer{cp.proxy, cp.control} {
		if a != nil && a.proc != nil {
			errs = append(errs, a.stop())
		}
	}
	if cp.etcd != nil {
		errs = append(errs, cp.etcd.stop(10*time.Second))
	}
	return errors.Join(errs...)
}

// compact makes history older than now unavailable: it writes a key
// outside the API's prefix (so that the revision moves on) and compacts
// etcd at the current revision. A watch from an older resource version
// then fails with 410 Gone.
func (cp *controlPlane) compact(ctx context.Context) (int64, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.etcdURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	r, err := c.Put(ctx, "/cidroute-test/compact", time.Now().String())
	if err != nil {
		return 0, err
	}
	if _, err := c.Compact(ctx, r.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return 0, err
	}
	return r.Header.Revision, nil
}

// writeCredentials writes the CA, the API servers' serving certificate,
// the service account signing key, the static tokens and the audit policy.
func (cp *controlPlane) writeCredentials() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cidroute-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	cp.caPEM = pemBlock("CERTIFICATE", caDER)
	files := map[string][]byte{
		"ca.crt":      cp.caPEM,
		"serving.crt": pemBlock("CERTIFICATE", srvDER),
		"serving.key": ecKeyPEM(srvKey),
		"sa.key":      ecKeyPEM(saKey),
		"sa.pub":      pubKeyPEM(&saKey.PublicKey),
		"tokens.csv": fmt.Appendf(nil, "%s,admin,uid-admin,\"system:masters\"\n%s,system:kube-controller-manager,uid-kcm,\"system:masters\"\n",
			adminToken, kcmToken),
		// Metadata of the proxies' EndpointSlice requests: the fault tests
		// count their lists and watches.
		"audit-policy.yaml": []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["system:serviceaccount:cidroute:cidproxy"]
    resources: [{group: "discovery.k8s.io", resources: ["endpointslices"]}]
  - level: None
`),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(cp.dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func ecKeyPEM(k *ecdsa.PrivateKey) []byte {
	der, _ := x509.MarshalECPrivateKey(k)
	return pemBlock("EC PRIVATE KEY", der)
}

func pubKeyPEM(k *ecdsa.PublicKey) []byte {
	der, _ := x509.MarshalPKIXPublicKey(k)
	return pemBlock("PUBLIC KEY", der)
}

// waitReady polls url (with the CA ca, or no verification when nil, and a
// bearer token) until it answers 200, p exits or timeout passes.
func waitReady(p *process, url string, ca []byte, token string, timeout time.Duration) error {
	tc := &tls.Config{InsecureSkipVerify: true}
	if ca != nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		tc = &tls.Config{RootCAs: pool}
	}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("exited: %v", p.err)
		}
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(b.String()))
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %v: %s", url, timeout, last)
}

// waitEtcd waits until etcd answers on url.
func waitEtcd(p *process, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("etcd exited: %v\n%s", p.err, p.tail(4000))
		}
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("etcd not ready after %v\n%s", timeout, p.tail(4000))
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago (all held open until every one is chosen, so none repeats).
func freePorts(n int) ([]uint16, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []uint16
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, uint16(l.Addr().(*net.TCPAddr).Port))
	}
	return ports, nil
}
