// qrt-dra-driver: the Kubernetes DRA driver qpu.qrtd.io.  It runs on each
// node (DaemonSet, tools/k8s/deploy) beside qrtd, publishes the node's
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

	"qrtd.io/tools/k8s/internal/driver"
	"qrtd.io/tools/k8s/internal/qrtd"
)

const usage = `Usage: qrt-dra-driver [flags]

The DRA driver qpu.qrtd.io: publishes this node's QPUs (from qrtd) as a
ResourceSlice, and reserves a QPU time slot for each ResourceClaim the
kubelet prepares on this node, on behalf of the claim's namespace
(qrtd.toml [tenants] delegates must name this driver's uid).

Examples:
  # In the DaemonSet (tools/k8s/deploy/driver.yaml): in-cluster credentials.
  qrt-dra-driver --node-name=$(NODE_NAME)

  # Outside a cluster, for a test: a kubeconfig and local directories.
  qrt-dra-driver --kubeconfig ~/.kube/config --node-name n1 \
      --qrtd-socket /run/qrtd/qrtd.sock --cdi-dir /tmp/cdi \
      --plugin-dir /tmp/plugins/qpu.qrtd.io --registry-dir /tmp/plugins_registry

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
	hostSock := fs.String("host-qrtd-socket", "", "qrtd's socket on the host, the CDI bind mount's source (default: --qrtd-socket)")
	ctrSock := fs.String("container-qrtd-socket", "/run/qrtd/qrtd.sock", "where containers find qrtd's socket (QRT_SOCKET)")
	cdiDir := fs.String("cdi-dir", "/var/run/cdi", "where CDI specs are written for the container runtime")
	pluginDir := fs.String("plugin-dir", "/var/lib/kubelet/plugins/"+driver.DriverName, "the plugin's directory: DRA socket and claim checkpoints")
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
	client := qrtd.New(*sock, *timeout)
	defer client.Close()
	rc := driver.RunConfig{
		Config: driver.Config{NodeName: *node, Socket: *sock, HostSocket: *hostSock,
			ContainerSocket: *ctrSock, CDIDir: *cdiDir, StateDir: *pluginDir, Lease: *lease, Poll: *poll},
		KubeClient: kube, PluginDir: *pluginDir, RegistryDir: *registryDir,
	}
	if err := driver.Run(ctx, rc, client); err != nil {
		fmt.Fprintf(os.Stderr, "qrt-dra-driver: %v\n", err)
		return 1
	}
	return 0
}
