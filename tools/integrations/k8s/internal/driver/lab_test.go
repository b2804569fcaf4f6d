package driver

// The test lab: a real qrtd (build/agent/qrtd run, with qpu-sim as the
// QPUs' control endpoints), the driver (in this process, or as a child
// process to SIGKILL), client-go's fake clientset as the API server, and
// the kubelet's side of the plugin protocol from the kubelet's own Go
// packages (pluginregistration v1, dra v1 and v1beta1).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"qrtd.io/tools/clients/go/qrtd"
	"qrtd.io/tools/integrations/k8s/test/apitest"
)

const (
	nodeName = "node-1"
	ms       = int64(time.Millisecond)
	// qpu0: periodic, a window of 900 ms after each 100 ms blackout at
	// the start of every second.  qpu1: pushed by the test.
	periodNS   = int64(time.Second)
	blackoutNS = 100 * ms
)

func TestMain(m *testing.M) {
	if dir := os.Getenv("QRT_POD_DIR"); dir != "" {
		os.Exit(podMain(dir))
	}
	if cfg := os.Getenv("QRT_DRA_CHILD"); cfg != "" {
		os.Exit(childMain(cfg))
	}
	code := m.Run()
	stopRealCluster()
	os.Exit(code)
}

type lab struct {
	t      *testing.T
	dir    string
	sock   string
	cfg    string
	state  string
	client *qrtd.Client
	qrtd   *exec.Cmd
	sim    *exec.Cmd
	qpus   []string
}

const qrtdConfig = `
[agent]
log_level = "info"
watchdog = false
[host]
apply_on_run = false
[dispatch]
mode = "untuned"
# Untuned on a shared 2-core host (other builds and tests beside): the
# pump and the dispatch thread may be late by tens of ms, far over the
# 100 us default; the pods' jobs are to complete here, not to test jitter
# (their slots end well inside the window, which lasts 900 ms).
miss_tolerance_ns = 500_000_000
[timeline]
policy = "edf-backfill"
horizon_ns = 600_000_000_000
[rpc]
socket_path = "%[1]s/qrtd.sock"
[roles]
reader = []
scheduler = ["uid:%[2]d"]
calibration = ["uid:%[2]d"]
admin = []
[tenants]
delegates = ["uid:%[2]d"]
max_near_term_ns = 600_000_000_000
max_payload_bytes = 3000
[probes]
enabled = false
`

const periodicQPU = `
[[qpu]]
name = "qpu0"
endpoint = "unix://%[1]s/qpu0.sock"
calibration = "periodic"
period_ns = 1_000_000_000
blackout_ns = 100_000_000
fidelity_f0 = 0.99
[qpu.device]
qubits = 5
technology = "superconducting"
basis_gates = ["rz", "sx", "x", "cx", "measure"]
coupling_map = [[0, 1], [1, 2], [2, 3], [3, 4]]
max_shots = 100000
`

func pushedQPU(name string) string {
	return `
[[qpu]]
name = "` + name + `"
endpoint = "unix://%[1]s/` + name + `.sock"
calibration = "pushed"
fidelity_f0 = 0.97
`
}

// demoQPU is the [[qpu]] of the project's demo profile (config/demo.toml),
// its endpoint moved into the lab's directory.
func demoQPU(t *testing.T) string {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "..", "config", "demo.toml"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i := strings.Index(s, "\n[[qpu]]\n")
	if i < 0 || strings.Contains(s[i+1:], "\n[") {
		t.Fatal("config/demo.toml: one [[qpu]] table, the last, expected")
	}
	return strings.ReplaceAll(strings.ReplaceAll(s[i:], "%", "%%"), "unix:///run/qrtd-demo-qpu/", "unix://%[1]s/")
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The QPUs of a lab.
type qpus int

const (
	periodic       qpus = iota // qpu0: periodic windows
	pushed                     // qpu0: windows pushed by the test
	periodicPushed             // qpu0 periodic, qpu1 pushed (two dispatch cores)
	demoProfile                // qpu0 of config/demo.toml: periodic, no [qpu.device]
	writeOnly                  // qpu0: periodic, its endpoint /dev/null (jobs end "sent")
)

// newLab starts qpu-sim and a real qrtd; skips when the binaries are not
// given (QRTD, QPU_SIM: ctest passes the built ones).
func newLab(t *testing.T, kind qpus) *lab { return newLabNamed(t, kind, "qpu0") }

// newLabNamed is newLab with its first QPU called qpu (instead of qpu0):
// nodes of one cluster whose QPUs a claim tells apart by name.
func newLabNamed(t *testing.T, kind qpus, qpu string) *lab {
	t.Helper()
	qrtdBin, simBin := os.Getenv("QRTD"), os.Getenv("QPU_SIM")
	if qrtdBin == "" || simBin == "" {
		t.Skip("QRTD and QPU_SIM must name the built qrtd and qpu-sim (ctest sets them)")
	}
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm" // one fsync per ledger change: test behaviour, not the disk
	}
	dir, err := os.MkdirTemp(base, "qrt-k8s-")
	if err != nil {
		t.Fatal(err)
	}
	l := &lab{t: t, dir: dir, sock: filepath.Join(dir, "qrtd.sock"), cfg: filepath.Join(dir, "qrtd.toml"),
		state: filepath.Join(dir, "state")}
	t.Cleanup(l.close)
	if err := os.Mkdir(l.state, 0o750); err != nil {
		t.Fatal(err)
	}
	cfg := qrtdConfig
	if os.Geteuid() == 0 {
		// qrtd started as root would drop to the package's user qrtd and
		// group qrt, which a test machine need not have: it keeps root.
		cfg = strings.Replace(cfg, "[agent]\n", "[agent]\nuser = \"root\"\n", 1)
		cfg = strings.Replace(cfg, "[rpc]\n", "[rpc]\nsocket_group = \"root\"\n", 1)
	}
	switch kind {
	case periodic:
		cfg += periodicQPU
		l.qpus = []string{"qpu0"}
	case pushed:
		cfg += pushedQPU("qpu0")
		l.qpus = []string{"qpu0"}
	case writeOnly:
		cfg += strings.Replace(periodicQPU, `"unix://%[1]s/qpu0.sock"`, `"file:///dev/null"`, 1)
	case demoProfile:
		cfg += demoQPU(t)
		l.qpus = []string{"qpu0"}
	case periodicPushed:
		// Untuned QPUs share the dispatch CPUs a small host can spare.
		cfg += periodicQPU + pushedQPU("qpu1")
		l.qpus = []string{"qpu0", "qpu1"}
	}
	if qpu != "qpu0" {
		cfg = strings.ReplaceAll(cfg, `"qpu0"`, `"`+qpu+`"`)
		cfg = strings.ReplaceAll(cfg, "/qpu0.sock", "/"+qpu+".sock")
		for i, q := range l.qpus {
			if q == "qpu0" {
				l.qpus[i] = qpu
			}
		}
	}
	if err := os.WriteFile(l.cfg, []byte(fmt.Sprintf(cfg, dir, os.Getuid())), 0o644); err != nil {
		t.Fatal(err)
	}
	if len(l.qpus) > 0 {
		l.sim = l.startSim()
	}
	l.startQrtd()
	l.client = qrtd.New(l.sock, 10*time.Second)
	return l
}

func (l *lab) startSim() *exec.Cmd {
	args := []string{"--duration-s", "600", "--summary-file", filepath.Join(l.dir, "qpu-sim.json")}
	socks, _ := filepath.Glob(filepath.Join(l.dir, "qpu*.sock"))
	for _, s := range socks {
		_ = os.Remove(s) // left by a stopped qpu-sim
	}
	for _, q := range l.qpus {
		args = append(args, "--listen", "unix://"+filepath.Join(l.dir, q+".sock"))
	}
	sim := exec.Command(os.Getenv("QPU_SIM"), args...)
	if err := sim.Start(); err != nil {
		l.t.Fatal(err)
	}
	for _, q := range l.qpus {
		waitFor(l.t, "qpu-sim's "+q, 10*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(l.dir, q+".sock"))
			return err == nil
		})
	}
	return sim
}

func (l *lab) startQrtd() {
	log, err := os.Create(filepath.Join(l.dir, fmt.Sprintf("qrtd-%d.log", time.Now().UnixNano())))
	if err != nil {
		l.t.Fatal(err)
	}
	defer log.Close()
	l.qrtd = exec.Command(os.Getenv("QRTD"), "run", "-c", l.cfg, "--state-dir", l.state)
	l.qrtd.Stdout, l.qrtd.Stderr = log, log
	if err := l.qrtd.Start(); err != nil {
		l.t.Fatal(err)
	}
	c := qrtd.New(l.sock, 2*time.Second)
	defer c.Close()
	waitFor(l.t, "qrtd's socket", 20*time.Second, func() bool {
		return c.Call(context.Background(), "agent.status", nil, nil) == nil
	})
}

func (l *lab) logTail() string {
	var out []string
	matches, _ := filepath.Glob(filepath.Join(l.dir, "qrtd-*.log"))
	for _, m := range matches {
		data, _ := os.ReadFile(m)
		lines := strings.Split(string(data), "\n")
		if len(lines) > 20 {
			lines = lines[len(lines)-20:]
		}
		out = append(out, m+":\n"+strings.Join(lines, "\n"))
	}
	return strings.Join(out, "\n")
}

func stopProc(c *exec.Cmd) {
	if c == nil || c.Process == nil || c.ProcessState != nil {
		return
	}
	_ = c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.Process.Kill()
		<-done
	}
}

func (l *lab) close() {
	if l.client != nil {
		l.client.Close()
	}
	stopProc(l.qrtd)
	stopProc(l.sim)
	if l.t.Failed() {
		l.t.Log(l.logTail())
	}
	_ = os.RemoveAll(l.dir)
}

// call is the test's own client of qrtd (the same uid as the driver, so
// it names the namespace to see the driver's bookings).
func (l *lab) call(method string, params, out any) error {
	return l.client.Call(context.Background(), method, params, out)
}

// ------------------------------------------------------------ the driver

type driverDirs struct {
	PluginDir   string `json:"plugin_dir"`
	RegistryDir string `json:"registry_dir"`
	CDIDir      string `json:"cdi_dir"`
}

func (l *lab) dirs(name string) driverDirs {
	d := driverDirs{PluginDir: filepath.Join(l.dir, name, "plugins", DriverName),
		RegistryDir: filepath.Join(l.dir, name, "plugins_registry"), CDIDir: filepath.Join(l.dir, name, "cdi")}
	return d
}

func runConfig(sock string, d driverDirs, kube kubernetes.Interface) RunConfig {
	return RunConfig{
		Config: Config{NodeName: nodeName, Socket: sock, CDIDir: d.CDIDir, StateDir: d.PluginDir,
			Lease: 3 * time.Second, Poll: 500 * time.Millisecond, BindingConditions: true,
			Proxy: ProxyLimits{MaxLineBytes: 4096, MaxConns: 4, IdleTimeout: 3 * time.Second, RequestsPerS: 10000, RequestBurst: 10000}},
		KubeClient: kube, PluginDir: d.PluginDir, RegistryDir: d.RegistryDir,
		Watchdog: 100 * time.Millisecond,
	}
}

func newFakeAPI(objs ...runtime.Object) *fake.Clientset {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid-1"}}
	return fake.NewClientset(append([]runtime.Object{node}, objs...)...)
}

// newHTTPAPI is the loopback API server (apitest: bodies decoded strictly,
// watches streamed) behind a real client-go REST clientset, holding the
// node: every API call of the driver and the test goes over HTTP.
func newHTTPAPI(t *testing.T) (kubernetes.Interface, *apitest.Server) {
	t.Helper()
	s := apitest.New(t)
	if err := s.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}); err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	return kube, s
}

// startDriver runs the driver in this process until the test ends.
func (l *lab) startDriver(name string, kube kubernetes.Interface) RunConfig {
	rc := runConfig(l.sock, l.dirs(name), kube)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	client := qrtd.New(l.sock, 10*time.Second)
	go func() { done <- Run(ctx, rc, client) }()
	l.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				l.t.Errorf("driver: %v", err)
			}
		case <-time.After(15 * time.Second):
			l.t.Errorf("driver did not stop")
		}
		client.Close()
	})
	waitFor(l.t, "the registration socket", 10*time.Second, func() bool {
		_, err := os.Stat(rc.RegistrationSocket())
		return err == nil
	})
	return rc
}

// The child process: the driver alone, its API server a fake clientset
// holding the claims of the file it is given.
type childConfig struct {
	Socket string                       `json:"socket"`
	Dirs   driverDirs                   `json:"dirs"`
	Claims []*resourceapi.ResourceClaim `json:"claims"`
}

func childMain(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var cc childConfig
	if err := json.Unmarshal(data, &cc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var objs []runtime.Object
	for _, c := range cc.Claims {
		objs = append(objs, c)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	client := qrtd.New(cc.Socket, 10*time.Second)
	if err := Run(ctx, runConfig(cc.Socket, cc.Dirs, newFakeAPI(objs...)), client); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func (l *lab) startChild(name string, claims ...*resourceapi.ResourceClaim) (*exec.Cmd, RunConfig) {
	d := l.dirs(name)
	path := filepath.Join(l.dir, name+"-child.json")
	data, err := json.Marshal(childConfig{Socket: l.sock, Dirs: d, Claims: claims})
	if err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "QRT_DRA_CHILD="+path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { stopProc(cmd) })
	rc := runConfig(l.sock, d, nil)
	// A killed driver leaves its socket behind: wait until one answers.
	waitFor(l.t, "the child's registration socket", 20*time.Second, func() bool {
		c, err := net.Dial("unix", rc.RegistrationSocket())
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return cmd, rc
}

// ------------------------------------------------------------ the kubelet

// kubelet plays the kubelet's side: the plugin watcher's registration
// (dial, GetInfo, checks, NotifyRegistrationStatus) and the DRA manager's
// calls, with the kubelet's timeouts.
type kubelet struct {
	t   *testing.T
	rc  RunConfig
	v1  drav1.DRAPluginClient
	v1b drav1beta1.DRAPluginClient
	cc  *grpc.ClientConn
}

func dialUnix(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	return cc
}

// register follows the kubelet's plugin watcher: GetInfo (1 s), the type,
// name and version checks of the DRA plugin handler, then
// NotifyRegistrationStatus with the verdict.
func register(t *testing.T, rc RunConfig, accept bool) (*registerapi.PluginInfo, error) {
	t.Helper()
	cc := dialUnix(t, rc.RegistrationSocket())
	defer cc.Close()
	reg := registerapi.NewRegistrationClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	var problem string
	switch {
	case info.Type != registerapi.DRAPlugin:
		problem = fmt.Sprintf("plugin type %q, want %q", info.Type, registerapi.DRAPlugin)
	case info.Name != DriverName:
		problem = fmt.Sprintf("plugin name %q, want %q", info.Name, DriverName)
	case !contains(info.SupportedVersions, drav1.DRAPluginService) && !contains(info.SupportedVersions, drav1beta1.DRAPluginService):
		problem = fmt.Sprintf("no supported DRA service in %v", info.SupportedVersions)
	}
	if problem != "" {
		t.Errorf("GetInfo: %s", problem)
		accept = false
	}
	st := &registerapi.RegistrationStatus{PluginRegistered: accept}
	if !accept {
		st.Error = "kubelet test: registration refused on purpose"
		if problem != "" {
			st.Error = problem
		}
	}
	_, err = reg.NotifyRegistrationStatus(ctx, st)
	return info, err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func newKubelet(t *testing.T, rc RunConfig) *kubelet {
	t.Helper()
	info, err := register(t, rc, true)
	if err != nil {
		t.Fatalf("NotifyRegistrationStatus(true): %v", err)
	}
	cc := dialUnix(t, info.Endpoint)
	t.Cleanup(func() { cc.Close() })
	return &kubelet{t: t, rc: rc, cc: cc, v1: drav1.NewDRAPluginClient(cc), v1b: drav1beta1.NewDRAPluginClient(cc)}
}

// The kubelet's timeout for NodePrepareResources/NodeUnprepareResources.
const pluginClientTimeout = 45 * time.Second

func claimRef(c *resourceapi.ResourceClaim) *drav1.Claim {
	return &drav1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

func (k *kubelet) prepare(claims ...*resourceapi.ResourceClaim) map[string]*drav1.NodePrepareResourceResponse {
	k.t.Helper()
	req := &drav1.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, claimRef(c))
	}
	ctx, cancel := context.WithTimeout(context.Background(), pluginClientTimeout)
	defer cancel()
	resp, err := k.v1.NodePrepareResources(ctx, req)
	if err != nil {
		k.t.Fatalf("NodePrepareResources: %v", err)
	}
	return resp.Claims
}

func (k *kubelet) unprepare(claims ...*resourceapi.ResourceClaim) map[string]*drav1.NodeUnprepareResourceResponse {
	k.t.Helper()
	req := &drav1.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, claimRef(c))
	}
	ctx, cancel := context.WithTimeout(context.Background(), pluginClientTimeout)
	defer cancel()
	resp, err := k.v1.NodeUnprepareResources(ctx, req)
	if err != nil {
		k.t.Fatalf("NodeUnprepareResources: %v", err)
	}
	return resp.Claims
}

// ------------------------------------------------------------ claims

// Claim UIDs are short (a real one is 36 bytes): the claim socket's path
// must fit a UNIX socket address.
var claimSeq atomic.Int64

// newClaim is a claim for n QPUs of the class, allocated by the test as
// the scheduler would: the given devices of the node's pool, with the
// claim's opaque parameters copied into the allocation.
func newClaim(ns, name string, params string, devices ...string) *resourceapi.ResourceClaim {
	cfg := resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(params)}}}
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("%s-%s-%d", ns, name, claimSeq.Add(1)))},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "qpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: DriverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
				Count: int64(len(devices))}}},
			Config: []resourceapi.DeviceClaimConfiguration{{Requests: []string{"qpu"}, DeviceConfiguration: cfg}},
		}},
	}
	alloc := &resourceapi.AllocationResult{}
	for _, d := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "qpu", Driver: DriverName, Pool: nodeName, Device: d})
	}
	alloc.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"qpu"}, DeviceConfiguration: cfg}}
	c.Status.Allocation = alloc
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + name, UID: types.UID("pod-" + string(c.UID))}}
	return c
}

func slotParams(fields string) string {
	return `{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"SlotParameters",` + fields + `}`
}

func createClaims(t *testing.T, kube kubernetes.Interface, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	for _, c := range claims {
		ctx := context.Background()
		claims := kube.ResourceV1().ResourceClaims(c.Namespace)
		created, err := claims.Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create claim: %v", err)
		}
		// The scheduler's allocation goes through the status subresource
		// (an API server drops the status on create); the claim then has
		// the server's UID and resourceVersion.
		created.Status = c.Status
		allocated, err := claims.UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("allocate claim: %v", err)
		}
		*c = *allocated
	}
}

// requireOverHTTP: the driver published its slice and its informers
// watched through the loopback API server.
func requireOverHTTP(t *testing.T, api *apitest.Server) {
	t.Helper()
	for _, c := range []struct{ verb, res string }{{"create", "resourceslices"}, {"watch", "resourceslices"}, {"get", "nodes"}} {
		if api.Count(c.verb, c.res) == 0 {
			t.Errorf("no %s of %s reached the API server", c.verb, c.res)
		}
	}
	t.Logf("API requests: slices create %d update %d, claims get %d updateStatus %d watch %d",
		api.Count("create", "resourceslices"), api.Count("update", "resourceslices"), api.Count("get", "resourceclaims"),
		api.Count("updateStatus", "resourceclaims"), api.Count("watch", "resourceclaims"))
}
