// Package cluster runs a real Kubernetes control plane on 127.0.0.1 for the
// driver's end-to-end tests: etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager, the binaries controlplane/build.sh builds from
// the pinned modules (QRT_K8S_BIN names their directory).
//
// Everything is authenticated and authorized as in a cluster: a CA of the
// cluster's own signs the API server's serving certificate and every
// client certificate (the test's admin in system:masters, the scheduler as
// system:kube-scheduler, the controller manager as
// system:kube-controller-manager with one ServiceAccount per controller,
// each node's kubelet as system:node:<name> in system:nodes); ServiceAccount
// tokens are signed by the API server (TokenRequest), bound to a pod when
// asked, so that a node's driver gets the node-bound identity a DaemonSet
// pod has.  Authorization is Node,RBAC with NodeRestriction admission.
//
// What is not run: the kubelet and a container runtime (the driver's
// tests play the kubelet's side), and the controller manager's
// node-lifecycle controller, which would mark every node unreachable, no
// kubelet heartbeating it; nodes are created Ready by AddNode.
package cluster

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// FeatureGates the components run with: the Workload API's gang
// scheduling (beta in 1.37, off by default).  Device binding conditions,
// device status, device taints and prioritized lists are on by default in
// 1.37.
var FeatureGates = []string{"GenericWorkload=true"}

// RuntimeConfig: the API versions enabled beyond the defaults (Workload
// and PodGroup are scheduling.k8s.io/v1beta1).
const RuntimeConfig = "scheduling.k8s.io/v1beta1=true"

// Controllers the controller manager runs: claims from templates and their
// reservations (resourceclaim), ServiceAccounts and their tokens, garbage
// collection (a generated claim goes with its pod), device taint eviction.
var Controllers = []string{
	"resourceclaim-controller", "serviceaccount-controller", "serviceaccount-token-controller",
	"garbage-collector-controller", "device-taint-eviction-controller", "root-ca-certificate-publisher-controller",
	"podgroup-protection-controller", "namespace-controller",
}

// Cluster is a running control plane.
type Cluster struct {
	Dir  string
	Bin  string
	Host string // https://127.0.0.1:PORT
	// The admin's client (system:masters) and its configuration.
	Admin       kubernetes.Interface
	AdminConfig *rest.Config
	// How long the control plane took to be ready.
	Started time.Duration

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
	caPEM []byte
	procs []*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// Bin is the directory of the control plane's binaries (QRT_K8S_BIN), or
// "" when they are not given.
func Bin() string { return os.Getenv("QRT_K8S_BIN") }

// Start runs etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager with their state and logs under dir, and waits
// until the API server is ready, the scheduler and the controller manager
// are running and the default ServiceAccount controller works.
func Start(ctx context.Context, bin, dir string) (*Cluster, error) {
	t0 := time.Now()
	c := &Cluster{Dir: dir, Bin: bin}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("control plane binary: %w (tools/integrations/k8s/controlplane/build.sh builds them)", err)
		}
	}
	if err := c.makePKI(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	etcdPort, peerPort, apiPort, err := freePorts()
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	if err := c.run("etcd", "--name=default", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL, "--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return nil, err
	}
	p := func(name string) string { return filepath.Join(dir, "pki", name) }
	gates := "--feature-gates=" + strings.Join(FeatureGates, ",")
	c.Host = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	if err := c.run("kube-apiserver", "--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(apiPort),
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc", "--api-audiences=https://kubernetes.default.svc",
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16", "--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction", "--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false", "--profiling=false", "--allow-privileged=true",
		"--runtime-config="+RuntimeConfig, gates, "--cert-dir="+filepath.Join(dir, "apiserver"), "-v=1"); err != nil {
		return nil, err
	}
	c.AdminConfig, err = c.clientConfig("admin", "system:masters")
	if err != nil {
		return nil, err
	}
	if c.Admin, err = kubernetes.NewForConfig(c.AdminConfig); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx); err != nil {
		return nil, err
	}
	sched, err := c.kubeconfig("kube-scheduler", "system:kube-scheduler")
	if err != nil {
		return nil, err
	}
	if err := c.run("kube-scheduler", "--kubeconfig="+sched, "--leader-elect=false", "--secure-port=0", gates, "-v=2"); err != nil {
		return nil, err
	}
	kcm, err := c.kubeconfig("kube-controller-manager", "system:kube-controller-manager")
	if err != nil {
		return nil, err
	}
	if err := c.run("kube-controller-manager", "--kubeconfig="+kcm, "--leader-elect=false", "--secure-port=0",
		"--controllers="+strings.Join(Controllers, ","), "--use-service-account-credentials=true",
		"--service-account-private-key-file="+p("sa.key"), "--root-ca-file="+p("ca.crt"),
		"--concurrent-gc-syncs=2", gates, "-v=1"); err != nil {
		return nil, err
	}
	// The controller manager works once a namespace gets its default
	// ServiceAccount (pods are admitted only then).
	if err := c.WaitForServiceAccount(ctx, "default", "default"); err != nil {
		return nil, err
	}
	ok = true
	c.Started = time.Since(t0)
	return c, nil
}

// freePorts: three ports on 127.0.0.1 the kernel just gave out.
func freePorts() (int, int, int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for i := 0; i < 3; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, 0, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports[0], ports[1], ports[2], nil
}

// run starts a component with its output in dir/NAME.log.
func (c *Cluster) run(name string, args ...string) error {
	log := filepath.Join(c.Dir, name+".log")
	f, err := os.Create(log)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(c.Bin, name), args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, and SIGKILL with the test process: no
	// component outlives a killed test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c.procs = append(c.procs, p)
	return nil
}

// Stop ends every component (SIGTERM, then SIGKILL after 10 s), the last
// started first.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	c.procs = nil
}

// Exited names a component that is no longer running, with its log's
// tail ("" while all run).
func (c *Cluster) Exited() string {
	for _, p := range c.procs {
		select {
		case <-p.done:
			return fmt.Sprintf("%s exited (%v):\n%s", p.name, p.cmd.ProcessState, Tail(p.log, 30))
		default:
		}
	}
	return ""
}

// Log is the path of a component's log.
func (c *Cluster) Log(name string) string { return filepath.Join(c.Dir, name+".log") }

// Tail is the last n lines of a file.
func Tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 180*time.Second)
	defer cancel()
	var last error
	for {
		if e := c.Exited(); e != "" {
			return errors.New(e)
		}
		body, err := c.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = fmt.Errorf("%v %s", err, body)
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after 180 s: %v\n%s", last, Tail(c.Log("kube-apiserver"), 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitForServiceAccount waits (up to 120 s) until the ServiceAccount exists:
// the controller manager makes "default" in each namespace.
func (c *Cluster) WaitForServiceAccount(ctx context.Context, ns, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	for {
		if _, err := c.Admin.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			return nil
		}
		if e := c.Exited(); e != "" {
			return errors.New(e)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no ServiceAccount %s/%s after 120 s:\n%s", ns, name, Tail(c.Log("kube-controller-manager"), 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ------------------------------------------------------------ identities

// NodeConfig is a node's kubelet credential: system:node:NAME in
// system:nodes, as the Node authorizer and NodeRestriction expect.
func (c *Cluster) NodeConfig(node string) (*rest.Config, error) {
	return c.clientConfig("system:node:"+node, "system:nodes")
}

// ServiceAccountConfig is the credential of a ServiceAccount: a token from
// the TokenRequest API, bound to the pod when one is given (the token of a
// pod's projected volume, carrying the pod's node).
func (c *Cluster) ServiceAccountConfig(ctx context.Context, ns, sa string, pod *corev1.Pod) (*rest.Config, error) {
	exp := int64(3600)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := c.Admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", ns, sa, err)
	}
	return &rest.Config{Host: c.Host, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM}, QPS: 50, Burst: 100}, nil
}

// AddNode registers a node as its kubelet would (with the node's own
// credential: NodeRestriction lets a node create only itself), Ready, with
// room for 110 pods, and takes off the not-ready taint that admission put
// on it (the node-lifecycle controller's work, which is not run).
func (c *Cluster) AddNode(ctx context.Context, name string, labels map[string]string) (*corev1.Node, error) {
	cfg, err := c.NodeConfig(name)
	if err != nil {
		return nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	l := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
	for k, v := range labels {
		l[k] = v
	}
	node, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("register node %s: %w", name, err)
	}
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
	now := metav1.Now()
	node.Status = corev1.NodeStatus{Capacity: res, Allocatable: res,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}}
	if node, err = kc.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("node %s status: %w", name, err)
	}
	for i := 0; i < 10; i++ {
		var keep []corev1.Taint
		for _, t := range node.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(node.Spec.Taints) {
			return node, nil
		}
		node.Spec.Taints = keep
		updated, err := c.Admin.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		if err == nil {
			return updated, nil
		}
		if node, err = c.Admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("node %s: could not take off the not-ready taint", name)
}

// ------------------------------------------------------------ PKI

func (c *Cluster) makePKI() error {
	dir := filepath.Join(c.Dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "qrtd-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	if c.ca, err = x509.ParseCertificate(der); err != nil {
		return err
	}
	c.caKey = key
	c.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), c.caPEM, 0o600); err != nil {
		return err
	}
	certPEM, keyPEM, err := c.sign(pkix.Name{CommonName: "kube-apiserver"}, true)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "apiserver.crt"), certPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "apiserver.key"), keyPEM, 0o600); err != nil {
		return err
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY",
		Bytes: x509.MarshalPKCS1PrivateKey(sa)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

var serial int64 = 1

// sign makes a key and a certificate of the cluster's CA: a server's for
// 127.0.0.1 and localhost, or a client's (CN the user, O the groups).
func (c *Cluster) sign(subject pkix.Name, server bool) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")}
		tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &key.PublicKey, c.caKey)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// clientConfig is a client certificate's configuration for user in group.
func (c *Cluster) clientConfig(user, group string) (*rest.Config, error) {
	var org []string
	if group != "" {
		org = []string{group}
	}
	certPEM, keyPEM, err := c.sign(pkix.Name{CommonName: user, Organization: org}, false)
	if err != nil {
		return nil, err
	}
	return &rest.Config{Host: c.Host, QPS: 100, Burst: 200, TLSClientConfig: rest.TLSClientConfig{
		CAData: c.caPEM, CertData: certPEM, KeyData: keyPEM}}, nil
}

// kubeconfig writes a component's kubeconfig file.
func (c *Cluster) kubeconfig(name, user string) (string, error) {
	cfg, err := c.clientConfig(user, "")
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.caPEM}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: name}
	kc.CurrentContext = "local"
	path := filepath.Join(c.Dir, name+".kubeconfig")
	return path, clientcmd.WriteToFile(*kc, path)
}

// Events is the cluster's events about an object, one a line ("" when
// none): what the scheduler and the controllers said.
func (c *Cluster) Events(ctx context.Context, ns, name string) string {
	evs, err := c.Admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var b bytes.Buffer
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "%s %s %s: %s (x%d)\n", e.LastTimestamp.Format(time.TimeOnly), e.Source.Component, e.Reason, e.Message, e.Count)
	}
	return b.String()
}
