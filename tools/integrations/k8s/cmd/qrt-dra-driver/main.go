// qrt-dra-driver: the Kubernetes DRA driver qpu.qrtd.io.  It runs on each
// node (DaemonSet, tools/integrations/k8s/deploy) beside qrtd, publishes the node's
// QPUs as a ResourceSlice and turns each ResourceClaim prepared on the
// node into a QPU time slot that qrtd reserves on behalf of the claim's
// namespace.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"qrtd.io/tools/clients/go/qrtd"
	"qrtd.io/tools/integrations/k8s/internal/driver"
)

const usage = `Usage: qrt-dra-driver [flags]

The DRA driver qpu.qrtd.io: publishes this node's QPUs (from qrtd) as a
ResourceSlice, and reserves a QPU time slot for each ResourceClaim the
kubelet prepares on this node, on behalf of the claim's namespace
(qrtd.toml [tenants] delegates must name this driver's uid).

Each prepared claim gets a socket of its own, served by this driver in
<plugin-dir>/claims/<claim UID>/ and bind-mounted into the pod's
containers (QRT_SOCKET): it forwards to qrtd, on behalf of the claim's
namespace, only agent.hello, qpus.list, slots.query, jobs.submit,
jobs.status, jobs.result and jobs.cancel, with jobs.submit's reservation_id
and the others' job_id pinned to the claim's own reservations, and serves
events.subscribe itself (job.finished of the claim's reservations).  Its
limits are the --claim-* flags.

Examples:
  # In the DaemonSet (tools/integrations/k8s/deploy/driver.yaml): in-cluster credentials.
  qrt-dra-driver --node-name=$(NODE_NAME)

  # Outside a cluster, for a test: a kubeconfig and local directories.
  qrt-dra-driver --kubeconfig ~/.kube/config --node-name n1 \
      --qrtd-socket /run/qrtd/qrtd.sock --cdi-dir /tmp/cdi \
      --plugin-dir /tmp/plugins/qpu.qrtd.io --registry-dir /tmp/plugins_registry

  # The cluster's gang controller (one replica; deploy/gang-controller.yaml).
  qrt-dra-driver --gang-controller

  # Pods that may hold 8 connections each to their claim's socket.
  qrt-dra-driver --node-name=$(NODE_NAME) --claim-max-connections 8

Flags:
`

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("qrt-dra-driver", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	node := fs.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster credentials)")
	sock := fs.String("qrtd-socket", "/run/qrtd/qrtd.sock", "qrtd's socket, as this driver reaches it")
	ctrSock := fs.String("container-qrtd-socket", "/run/qrtd/qrtd.sock", "where containers find their claim's socket (QRT_SOCKET; its directory is the bind mount)")
	cdiDir := fs.String("cdi-dir", "/var/run/cdi", "where CDI specs are written for the container runtime")
	pluginDir := fs.String("plugin-dir", "/var/lib/kubelet/plugins/"+driver.DriverName, "the plugin's directory: DRA socket and claim checkpoints")
	hostPluginDir := fs.String("host-plugin-dir", "", "--plugin-dir as the host's container runtime sees it, the claim sockets' bind mount source (default: --plugin-dir)")
	def := driver.DefaultProxyLimits
	maxLine := fs.Int("claim-max-line-bytes", def.MaxLineBytes, "longest request line on a claim socket (more: line_too_long, connection closed)")
	maxConns := fs.Int("claim-max-connections", def.MaxConns, "connections one claim's socket serves at once (more: overloaded, closed)")
	idle := fs.Duration("claim-idle-timeout", def.IdleTimeout, "a claim socket's connection silent this long is closed")
	rps := fs.Float64("claim-requests-per-s", def.RequestsPerS, "requests per second one claim may send (more: quota_exceeded, quota claim_requests)")
	burst := fs.Int("claim-request-burst", def.RequestBurst, "requests one claim may send at once after being idle")
	binding := fs.Bool("binding-conditions", true, "publish the devices with binding conditions and reserve before the pod binds (KEP-5007: gates DRADeviceBindingConditions, DRAResourceClaimDeviceStatus); false: reserve at NodePrepareResources")
	podStart := fs.Duration("pod-start", driver.DefaultPodStart, "with binding conditions: the time the kubelet gets to start a pod after it binds; relative notBefore/deadline count from then")
	bindingCheck := fs.Duration("binding-check", driver.DefaultBindingCheck, "with binding conditions: how often kube-scheduler checks them (its PreBind polls every 5 s)")
	gangController := fs.Bool("gang-controller", false, "run the cluster's gang controller instead of a node's driver: it leads the common start of a PodGroup's QPU claims across nodes (deploy/gang-controller.yaml; tools/integrations/k8s/README.md \"A gang across QPU nodes\")")
	registryDir := fs.String("registry-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registry")
	lease := fs.Duration("lease", 30*time.Second, "each reservation's lease, heartbeated every lease/3")
	poll := fs.Duration("poll", 5*time.Second, "how often qpus.list is read for endpoint up/down")
	timeout := fs.Duration("qrtd-timeout", 10*time.Second, "bound of one call to qrtd")
	klog.InitFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *podStart <= 0 || *bindingCheck <= 0 {
		fmt.Fprintln(os.Stderr, "qrt-dra-driver: --pod-start and --binding-check must be positive")
		return 2
	}
	if *maxLine < 1024 || *maxConns < 1 || *idle <= 0 || *rps <= 0 || *burst < 1 {
		fmt.Fprintln(os.Stderr, "qrt-dra-driver: --claim-max-line-bytes must be at least 1024, --claim-max-connections, --claim-request-burst at least 1, --claim-idle-timeout and --claim-requests-per-s positive")
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "qrt-dra-driver: unexpected argument %q (see --help)\n", fs.Arg(0))
		return 2
	}
	var cfg *rest.Config
	var err error
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "qrt-dra-driver: Kubernetes credentials: %v\n", err)
		return 1
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "qrt-dra-driver: Kubernetes client: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *gangController {
		if err := driver.RunGangController(ctx, kube, driver.GangConfig{BindingCheck: *bindingCheck, PodStart: *podStart}); err != nil {
			fmt.Fprintf(os.Stderr, "qrt-dra-driver: %v\n", err)
			return 1
		}
		return 0
	}
	client := qrtd.New(*sock, *timeout)
	defer client.Close()
	rc := driver.RunConfig{
		Config: driver.Config{NodeName: *node, Socket: *sock, HostStateDir: *hostPluginDir,
			ContainerSocket: *ctrSock, Proxy: driver.ProxyLimits{MaxLineBytes: *maxLine, MaxConns: *maxConns,
				IdleTimeout: *idle, RequestsPerS: *rps, RequestBurst: *burst},
			BindingConditions: *binding, PodStart: *podStart, BindingCheck: *bindingCheck, CDIDir: *cdiDir, StateDir: *pluginDir, Lease: *lease, Poll: *poll},
		KubeClient: kube, PluginDir: *pluginDir, RegistryDir: *registryDir,
	}
	if err := driver.Run(ctx, rc, client); err != nil {
		fmt.Fprintf(os.Stderr, "qrt-dra-driver: %v\n", err)
		return 1
	}
	return 0
}
