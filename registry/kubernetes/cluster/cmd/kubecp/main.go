// Command kubecp is a local Kubernetes control plane in one binary, for
// the cluster tests: the first argument picks the program, the rest are
// its flags, unchanged.
//
//	kubecp etcd -data-dir DIR -listen-client URL -listen-peer URL
//	kubecp kube-apiserver --etcd-servers=... (kube-apiserver's flags)
//	kubecp kube-controller-manager --kubeconfig=... (its flags)
//
// kube-apiserver and kube-controller-manager are the upstream commands of
// k8s.io/kubernetes, built from the same constructors as their own mains;
// etcd is go.etcd.io/etcd/server's embedded server at the version
// Kubernetes itself requires. One binary links the shared code once.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "time/tzdata" // as the upstream mains: CronJob time zones

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubecp etcd|kube-apiserver|kube-controller-manager [flags]")
		os.Exit(2)
	}
	prog, args := os.Args[1], os.Args[2:]
	switch prog {
	case "etcd":
		os.Exit(etcd(args))
	case "kube-apiserver":
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-controller-manager":
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	}
	fmt.Fprintf(os.Stderr, "kubecp: unknown program %q\n", prog)
	os.Exit(2)
}

// etcd runs a single-member etcd until SIGTERM or SIGINT.
func etcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dir := fs.String("data-dir", "", "data `directory`")
	client := fs.String("listen-client", "http://127.0.0.1:2379", "client `URL`")
	peer := fs.String("listen-peer", "http://127.0.0.1:2380", "peer `URL`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cu, err := url.Parse(*client)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 2
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dir
	cfg.Name = "kubecp"
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "warn"
	// Tests want their writes durable only as long as the process lives.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: ready")
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		return 0
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
}
