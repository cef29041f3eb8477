package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/dtls"
)

// A forwarder is one contender of the benchmark.
type forwarder struct {
	Name string
	// PPv2: the forwarder adds a PROXY v2 header, so its backend is the
	// PPv2 echo; otherwise the plain echo.
	PPv2 bool
	// Allocs: its /metrics reports Go heap allocations.
	Allocs bool
	start  func(e *env, backend netip.AddrPort) (*process, error)
}

var forwarders = []forwarder{
	{Name: "cidproxy-1w", PPv2: true, Allocs: true, start: func(e *env, b netip.AddrPort) (*process, error) { return e.startCidproxy(b, 1, "thread") }},
	{Name: "cidproxy-2w", PPv2: true, Allocs: true, start: func(e *env, b netip.AddrPort) (*process, error) { return e.startCidproxy(b, 2, "thread") }},
	// The netpoller wait, for the cost of waking up (issue 20).
	{Name: "cidproxy-1w-np", PPv2: true, Allocs: true, start: func(e *env, b netip.AddrPort) (*process, error) { return e.startCidproxy(b, 1, "netpoller") }},
	// The socket filter that drops what can never route (-overload's junk
	// floods).
	{Name: "cidproxy-1w-ed", PPv2: true, Allocs: true, start: func(e *env, b netip.AddrPort) (*process, error) {
		return e.startCidproxyWith(b, 1, "thread", map[string]any{"early_drop": true})
	}},
	{Name: "raw", PPv2: true, start: func(e *env, b netip.AddrPort) (*process, error) {
		return e.startListener("rawfwd", "-listen", "127.0.0.1:0", "-backend", b.String())
	}},
	{Name: "naive", start: func(e *env, b netip.AddrPort) (*process, error) {
		return e.startListener("naivefwd", "-listen", "127.0.0.1:0", "-backend", b.String())
	}},
	{Name: "nginx", start: func(e *env, b netip.AddrPort) (*process, error) { return e.startNginx(b, true) }},
	{Name: "nginx-session", start: func(e *env, b netip.AddrPort) (*process, error) { return e.startNginx(b, false) }},
}

// rawName is the baseline every ratio is taken against.
const rawName = "raw"

func lookupForwarder(name string) (forwarder, bool) {
	for _, f := range forwarders {
		if f.Name == name {
			return f, true
		}
	}
	return forwarder{}, false
}

// env is where the processes come from and which CPU they run on.
type env struct {
	bin      string // directory of loadgen, echo, cidproxy, rawfwd, naivefwd
	nginx    string // nginx binary; "" when not installed
	nginxMod string // ngx_stream_module.so
	tmp      string
	fwdCPU   string // taskset CPU list for the forwarder; "" = no pinning
	genCPU   string // for loadgen and the echo backends
	recvBuf  int    // cidproxy's recv_buffer; 0 = its default
	log      io.Writer
}

// A process is a started program; Stop ends it.
type process struct {
	cmd       *exec.Cmd
	addr      netip.AddrPort // where it listens for clients
	debugURL  string         // cidproxy's metrics listener: http://127.0.0.1:PORT
	pprofBase string         // cidproxy's profiler listener (pprof_listen): http://127.0.0.1:PORT
	stderr    *tail
	done      chan struct{}
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// pprofURL names one of Go's profiles on the process's profiler listener.
func (p *process) pprofURL(profile string) string { return p.pprofBase + "/debug/pprof/" + profile }

// Stop sends SIGTERM, waits up to 5 s, then kills.
func (p *process) Stop() {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// command builds an exec.Cmd pinned to cpu with taskset, which execs the
// program in place: the pid is the program's.
func command(cpu, bin string, args ...string) *exec.Cmd {
	if cpu == "" {
		return exec.Command(bin, args...)
	}
	return exec.Command("taskset", append([]string{"-c", cpu, bin}, args...)...)
}

// tail keeps the last 4 KB written to it, for error messages.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tail) String() string { return strings.TrimSpace(string(t.b)) }

func launch(cmd *exec.Cmd) (*process, io.ReadCloser, error) {
	p := &process{cmd: cmd, stderr: &tail{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	var out io.ReadCloser
	var err error
	if cmd.Stdout == nil {
		if out, err = cmd.StdoutPipe(); err != nil {
			return nil, nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	return p, out, nil
}

// startListener runs one of our programs that prints "NAME listening on
// ADDR" when ready.
func (e *env) startListener(name string, args ...string) (*process, error) {
	return e.startListenerOn(e.fwdCPU, name, args...)
}

func (e *env) startListenerOn(cpu, name string, args ...string) (*process, error) {
	p, out, err := launch(command(cpu, filepath.Join(e.bin, name), args...))
	if err != nil {
		return nil, err
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		io.Copy(io.Discard, out)
	}()
	select {
	case l, ok := <-line:
		_, a, found := strings.Cut(l, " listening on ")
		ap, perr := netip.ParseAddrPort(a)
		if !ok || !found || perr != nil {
			p.Stop()
			return nil, fmt.Errorf("%s did not start (%q): %s", name, l, p.stderr)
		}
		p.addr = ap
		return p, nil
	case <-time.After(10 * time.Second):
		p.Stop()
		return nil, fmt.Errorf("%s: no address within 10 s: %s", name, p.stderr)
	}
}

// freeUDP and freeTCP return loopback ports that were free a moment ago.
func freeUDP() (int, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}

func freeTCP() (int, error) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (e *env) startCidproxy(backend netip.AddrPort, workers int, wait string) (*process, error) {
	return e.startCidproxyWith(backend, workers, wait, nil)
}

// startCidproxyWith starts cidproxy with more keys for its service
// (recv_buffer from -cidproxy-recv-buffer unless keys has one).
func (e *env) startCidproxyWith(backend netip.AddrPort, workers int, wait string, keys map[string]any) (*process, error) {
	port, err := freeUDP()
	if err != nil {
		return nil, err
	}
	mport, err := freeTCP()
	if err != nil {
		return nil, err
	}
	pport, err := freeTCP()
	if err != nil {
		return nil, err
	}
	type be struct {
		Ordinal int    `json:"ordinal"`
		Address string `json:"address"`
	}
	cfg := map[string]any{
		"metrics_listen": fmt.Sprintf("127.0.0.1:%d", mport),
		"pprof_listen":   fmt.Sprintf("127.0.0.1:%d", pport),
		"log_level":      "warn",
		"wait":           wait,
		"services": []map[string]any{{
			"name": "bench", "protocol": "dtls", "listen": fmt.Sprintf("127.0.0.1:%d", port),
			"workers": workers, "backends": []be{{0, backend.String()}},
		}},
	}
	svc := cfg["services"].([]map[string]any)[0]
	if e.recvBuf > 0 {
		svc["recv_buffer"] = e.recvBuf
	}
	for k, v := range keys {
		svc[k] = v
	}
	b, _ := json.Marshal(cfg)
	path := filepath.Join(e.tmp, fmt.Sprintf("cidproxy-%d.json", port))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return nil, err
	}
	cmd := command(e.fwdCPU, filepath.Join(e.bin, "cidproxy"), "-config", path)
	cmd.Stdout = io.Discard
	p, _, err := launch(cmd)
	if err != nil {
		return nil, err
	}
	p.addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port))
	p.debugURL = fmt.Sprintf("http://127.0.0.1:%d", mport)
	p.pprofBase = fmt.Sprintf("http://127.0.0.1:%d", pport)
	return p, nil
}

// startNginx runs nginx's UDP stream proxy in the foreground as a single
// process (no master, one event loop), with its own prefix and
// configuration; the system's nginx service is not touched. perDatagram
// sets proxy_responses 1: a session ends with its reply.
func (e *env) startNginx(backend netip.AddrPort, perDatagram bool) (*process, error) {
	if e.nginx == "" {
		return nil, errors.New("nginx not installed (Debian packages nginx, libnginx-mod-stream)")
	}
	port, err := freeUDP()
	if err != nil {
		return nil, err
	}
	prefix, err := os.MkdirTemp(e.tmp, "nginx-")
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConf(e.nginxMod, prefix, port, backend, perDatagram)), 0o644); err != nil {
		return nil, err
	}
	cmd := command(e.fwdCPU, e.nginx, "-p", prefix, "-c", conf, "-e", filepath.Join(prefix, "error.log"))
	cmd.Stdout = io.Discard
	p, _, err := launch(cmd)
	if err != nil {
		return nil, err
	}
	p.addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port))
	return p, nil
}

func nginxConf(module, prefix string, port int, backend netip.AddrPort, perDatagram bool) string {
	responses := ""
	if perDatagram {
		responses = "proxy_responses 1;"
	}
	return fmt.Sprintf(`load_module %s;
daemon off;
master_process off;
worker_processes 1;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 50000; }
stream {
	server {
		listen 127.0.0.1:%d udp;
		proxy_pass %s;
		%s
		proxy_timeout 60s;
	}
}
`, module, prefix, prefix, port, backend, responses)
}

// waitReady sends a DTLS-CID probe through p until its echo comes back.
func waitReady(ctx context.Context, p *process) error {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return err
	}
	defer c.Close()
	// A tls12_cid record (type 25, DTLS 1.2, epoch 1, sequence 1) whose
	// CID carries ordinal 0, the one backend.
	cid, _ := dtls.OrdinalFirst{}.AppendCID(nil, 0)
	probe, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: 1, CID: cid, Fragment: []byte("ready?")})
	if err != nil {
		return err
	}
	buf := make([]byte, 2048)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-p.done:
			return fmt.Errorf("exited: %s", p.stderr)
		default:
		}
		c.WriteToUDPAddrPort(probe, p.addr)
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, _, err := c.ReadFromUDPAddrPort(buf); err == nil && string(buf[:n]) == string(probe) {
			return nil
		}
	}
	return fmt.Errorf("no echo through %s within 10 s: %s", p.addr, p.stderr)
}
