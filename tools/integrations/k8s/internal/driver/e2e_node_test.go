package driver

// The end-to-end fixture: the real control plane (test/cluster:
// etcd, kube-apiserver, kube-scheduler, kube-controller-manager on
// 127.0.0.1), the deploy's own manifests applied as an admin would, and per
// QPU node a real qrtd with qpu-sim (the lab), the driver under the
// deploy's ServiceAccount (a token bound to a driver pod on the node, as a
// DaemonSet's pod has) and a kubelet stand-in.
//
// The kubelet stand-in is what is not real: no kubelet or container
// runtime is installable here.  It speaks the kubelet's plugin protocol
// with the kubelet's own Go packages (registration, NodePrepareResources,
// NodeUnprepareResources: the lab's kubelet) and does the part of the
// kubelet's pod lifecycle the driver meets, under the node's own
// credential (system:node:NAME, so the Node authorizer and NodeRestriction
// decide what it may read and write): it watches the pods bound to its
// node, prepares their claims once the claims are reserved for them,
// applies the CDI specs to an OCI spec as a runtime would (the container's
// environment and mounts are kept for the test), marks the pod Running,
// and on deletion unprepares and removes the pod.  The container itself
// is the test (a pod child process through the claim socket).

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"

	"qrtd.io/tools/clients/go/qrtd"
	"qrtd.io/tools/integrations/k8s/test/cluster"
)

// The one control plane of this test binary, started by the first
// end-to-end test and stopped by TestMain.
var realCP struct {
	once sync.Once
	c    *cluster.Cluster
	dir  string
	err  error
}

func stopRealCluster() {
	if realCP.c != nil {
		realCP.c.Stop()
	}
	if realCP.dir != "" {
		_ = os.RemoveAll(realCP.dir)
	}
}

// e2e is one test's view of the real cluster.
type e2e struct {
	t *testing.T
	c *cluster.Cluster
}

// realCluster starts the control plane (once) and applies the deploy's
// RBAC and DeviceClass; the test is skipped when the binaries are not
// given (run-tests.sh builds them and gives them).
func realCluster(t *testing.T) *e2e {
	t.Helper()
	if cluster.Bin() == "" {
		t.Skip("QRT_K8S_BIN not given: run tools/integrations/k8s/run-tests.sh, which builds the control plane")
	}
	realCP.once.Do(func() {
		realCP.dir, realCP.err = os.MkdirTemp("", "qrt-k8s-cp-")
		if realCP.err != nil {
			return
		}
		realCP.c, realCP.err = cluster.Start(context.Background(), cluster.Bin(), realCP.dir)
		if realCP.err != nil {
			return
		}
		t.Logf("control plane (%s) ready in %v", cluster.Bin(), realCP.c.Started.Round(time.Millisecond))
		for _, f := range []string{"rbac.yaml", "deviceclass.yaml"} {
			if realCP.err = applyManifest(realCP.c.Admin, deployFile(f), ""); realCP.err != nil {
				return
			}
		}
	})
	if realCP.err != nil {
		t.Fatalf("the real control plane: %v", realCP.err)
	}
	if e := realCP.c.Exited(); e != "" {
		t.Fatalf("the real control plane: %s", e)
	}
	return &e2e{t: t, c: realCP.c}
}

func deployFile(name string) string { return filepath.Join("..", "..", "deploy", name) }

// manifestObjects decodes a multi-document YAML file into API objects.
func manifestObjects(path string) ([]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []any
	for i, doc := range bytes.Split(data, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s #%d: %w", path, i, err)
		}
		out = append(out, obj)
	}
	return out, nil
}

// applyManifest creates a manifest's objects (ns, when given, replaces
// their namespace), as kubectl apply would on a fresh cluster.
func applyManifest(kube kubernetes.Interface, path, ns string) error {
	objs, err := manifestObjects(path)
	if err != nil {
		return err
	}
	ctx := context.Background()
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = kube.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = kube.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = kube.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = kube.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = kube.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *resourceapi.DeviceClass:
			_, err = kube.ResourceV1().DeviceClasses().Create(ctx, o, metav1.CreateOptions{})
		case *resourceapi.ResourceClaimTemplate:
			if ns != "" {
				o.Namespace = ns
			}
			_, err = kube.ResourceV1().ResourceClaimTemplates(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *resourceapi.ResourceClaim:
			if ns != "" {
				o.Namespace = ns
			}
			_, err = kube.ResourceV1().ResourceClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Pod:
			if ns != "" {
				o.Namespace = ns
			}
			_, err = kube.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *schedulingv1beta1.PodGroup:
			if ns != "" {
				o.Namespace = ns
			}
			_, err = kube.SchedulingV1beta1().PodGroups(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.DaemonSet, *appsv1.Deployment:
			// Workloads need a kubelet: the fixture makes their pods.
		default:
			return fmt.Errorf("%s: cannot apply a %T", path, obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %T: %w", path, obj, err)
		}
	}
	return nil
}

// namespace makes a namespace and waits for its default ServiceAccount
// (pods are admitted only then); it is deleted when the test ends.
func (e *e2e) namespace(name string) {
	e.t.Helper()
	ctx := context.Background()
	_, err := e.c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.c.Admin.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		// Its claims are gone before the next test's pods schedule.
		_ = e.c.Admin.ResourceV1().ResourceClaims(name).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	if err := e.c.WaitForServiceAccount(ctx, name, "default"); err != nil {
		e.t.Fatal(err)
	}
}

// ------------------------------------------------------------ a QPU node

type e2eNode struct {
	t    *testing.T
	e    *e2e
	name string
	lab  *lab
	rc   RunConfig
	// The driver's client: the deploy's ServiceAccount, its token bound
	// to the driver's pod on this node.
	kube kubernetes.Interface
	// The kubelet's: system:node:NAME.
	nodeKube kubernetes.Interface
	kl       *kubelet

	mu   sync.Mutex
	pods map[types.UID]*e2ePod
	// Called by the kubelet stand-in after it reported a pod Running (a
	// test widens the window between that report and what follows it).
	reported func(*corev1.Pod)
	wake     chan struct{}
	// The running driver: stopDriver ends it.
	driverStop func()
}

// startDriver runs the node's driver in this process and registers it
// with the kubelet stand-in.
func (n *e2eNode) startDriver() {
	t := n.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	client := qrtd.New(n.lab.sock, 10*time.Second)
	go func() { done <- Run(ctx, n.rc, client) }()
	n.driverStop = func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("driver on %s: %v", n.name, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("driver on %s did not stop", n.name)
		}
		client.Close()
	}
	waitFor(t, "the registration socket of "+n.name, 10*time.Second, func() bool {
		_, err := os.Stat(n.rc.RegistrationSocket())
		return err == nil
	})
	kl := newKubelet(t, n.rc)
	n.mu.Lock()
	n.kl = kl
	n.mu.Unlock()
	n.kick()
}

// stopDriver stops the node's driver (its slice stays published, as when
// a driver's pod is restarted).
func (n *e2eNode) stopDriver() {
	n.mu.Lock()
	stop := n.driverStop
	n.driverStop = nil
	n.kl = nil
	n.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// e2ePod is what the kubelet stand-in did with a pod.
type e2ePod struct {
	Name, Namespace string
	Claims          []*resourceapi.ResourceClaim
	Container       slotEnv   // the container's environment and /run/qrtd mount, from the CDI specs
	Running         time.Time // when its containers started (before the pod is reported Running)
	Reported        bool      // the pod's status says Running
	PrepareError    string
	Unprepared      bool
}

// addNode registers a QPU node (label qrtd.io/qpu=true) with its own qrtd
// and qpu-sim, starts its driver and its kubelet stand-in.  dir is a short
// name for its directories (the claim sockets' paths must fit 107 bytes).
func (e *e2e) addNode(name, dir string, kind qpus, qpu ...string) *e2eNode {
	t := e.t
	t.Helper()
	ctx := context.Background()
	q := "qpu0"
	if len(qpu) > 0 {
		q = qpu[0]
	}
	l := newLabNamed(t, kind, q)
	if _, err := e.c.AddNode(ctx, name, map[string]string{"qrtd.io/qpu": "true"}); err != nil {
		t.Fatal(err)
	}
	n := &e2eNode{t: t, e: e, name: name, lab: l, pods: map[types.UID]*e2ePod{}, wake: make(chan struct{}, 1)}
	t.Cleanup(func() {
		// The node goes (its ResourceSlices, owned by it, with it).
		_ = e.c.Admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = e.c.Admin.ResourceV1().ResourceSlices().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	})
	nodeCfg, err := e.c.NodeConfig(name)
	if err != nil {
		t.Fatal(err)
	}
	if n.nodeKube, err = kubernetes.NewForConfig(nodeCfg); err != nil {
		t.Fatal(err)
	}
	// The kubelet stand-in runs first: it runs the driver's pod.
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); n.runKubelet(kctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// The driver's pod, as the deploy's DaemonSet controller makes it.
	objs, err := manifestObjects(deployFile("driver.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ds := objs[0].(*appsv1.DaemonSet)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: ds.Name + "-" + name, Namespace: ds.Namespace,
		Labels: ds.Spec.Template.Labels}, Spec: *ds.Spec.Template.Spec.DeepCopy()}
	pod.Spec.NodeName = name
	if pod, err = e.c.Admin.CoreV1().Pods(ds.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the driver's pod: %v", err)
	}
	t.Cleanup(func() {
		_ = e.c.Admin.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	cfg, err := e.c.ServiceAccountConfig(ctx, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName, pod)
	if err != nil {
		t.Fatal(err)
	}
	if n.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	n.rc = runConfig(l.sock, l.dirs(dir), n.kube)
	n.rc.NodeName = name
	n.startDriver()
	t.Cleanup(n.stopDriver)
	waitFor(t, "the ResourceSlice of "+name, 30*time.Second, func() bool { return len(n.slice()) > 0 })
	return n
}

// slice is the node's published devices, by name.
func (n *e2eNode) slice() map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	list, err := n.e.c.Admin.ResourceV1().ResourceSlices().List(context.Background(),
		metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.name})
	if err != nil {
		return out
	}
	for _, s := range list.Items {
		if s.Spec.Driver == DriverName {
			for _, d := range s.Spec.Devices {
				out[d.Name] = d
			}
		}
	}
	return out
}

func (n *e2eNode) kick() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// pod is what the stand-in did with the pod (nil: nothing yet).
func (n *e2eNode) pod(uid types.UID) *e2ePod {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.pods[uid]; ok {
		c := *p
		return &c
	}
	return nil
}

// runKubelet: the stand-in's loop.  It looks at the node's pods on every
// watch event and every 500 ms (a prepare that failed is retried, as the
// kubelet does).
func (n *e2eNode) runKubelet(ctx context.Context) {
	factory := informers.NewSharedInformerFactoryWithOptions(n.nodeKube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.name).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.kick() },
		UpdateFunc: func(any, any) { n.kick() },
		DeleteFunc: func(any) { n.kick() },
	})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.wake:
		case <-time.After(500 * time.Millisecond):
		}
		seen := map[types.UID]bool{}
		for _, obj := range inf.GetStore().List() {
			pod := obj.(*corev1.Pod)
			seen[pod.UID] = true
			n.syncPod(ctx, pod)
		}
		// Pods deleted outright (no graceful deletion seen): unprepare.
		n.mu.Lock()
		var gone []*e2ePod
		for uid, p := range n.pods {
			if !seen[uid] && !p.Unprepared && !p.Running.IsZero() {
				gone = append(gone, p)
			}
		}
		n.mu.Unlock()
		for _, p := range gone {
			n.unpreparePod(ctx, p)
		}
	}
}

func (n *e2eNode) syncPod(ctx context.Context, pod *corev1.Pod) {
	n.mu.Lock()
	p := n.pods[pod.UID]
	if p == nil {
		p = &e2ePod{Name: pod.Name, Namespace: pod.Namespace}
		n.pods[pod.UID] = p
	}
	kl := n.kl
	n.mu.Unlock()
	if pod.DeletionTimestamp != nil {
		if !p.Unprepared {
			n.unpreparePod(ctx, p)
		}
		// The kubelet's final delete, once the containers are gone.
		_ = n.nodeKube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		return
	}
	if p.Reported || (p.Running.IsZero() && len(pod.Spec.ResourceClaims) > 0 && kl == nil) {
		return
	}
	if p.Running.IsZero() && !n.startContainers(ctx, pod, p, kl) {
		return
	}
	n.reportRunning(ctx, pod, p)
}

// startContainers prepares the pod's claims and "starts" its containers:
// their environment and mounts, from the CDI specs, are recorded before
// the pod is reported Running, as a kubelet starts the containers before
// it reports them (false: not started, the reason in PrepareError).
func (n *e2eNode) startContainers(ctx context.Context, pod *corev1.Pod, p *e2ePod, kl *kubelet) bool {
	// The pod's claims, as the kubelet resolves them: by name, or the
	// claim the resourceclaim controller made from the template.
	var claims []*resourceapi.ResourceClaim
	for _, pc := range pod.Spec.ResourceClaims {
		name := ptr.Deref(pc.ResourceClaimName, "")
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.Name == pc.Name && st.ResourceClaimName != nil {
				name = *st.ResourceClaimName
			}
		}
		if name == "" {
			return false // not made yet
		}
		claim, err := n.nodeKube.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			n.setPrepareError(p, err.Error())
			return false
		}
		reservedForPod := false
		for _, r := range claim.Status.ReservedFor {
			reservedForPod = reservedForPod || r.UID == pod.UID
		}
		if !reservedForPod {
			n.setPrepareError(p, fmt.Sprintf("claim %s is not reserved for the pod", name))
			return false
		}
		claims = append(claims, claim)
	}
	var env slotEnv
	if len(claims) > 0 {
		req := &drav1.NodePrepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, claimRef(c))
		}
		pctx, cancel := context.WithTimeout(ctx, pluginClientTimeout)
		resp, err := kl.v1.NodePrepareResources(pctx, req)
		cancel()
		if err != nil {
			n.setPrepareError(p, err.Error())
			return false
		}
		var ids []string
		for _, c := range claims {
			r := resp.Claims[string(c.UID)]
			if r == nil || r.Error != "" {
				n.setPrepareError(p, fmt.Sprintf("claim %s: %v", c.Name, r))
				return false
			}
			for _, d := range r.Devices {
				ids = append(ids, d.CdiDeviceIds...)
			}
		}
		if env, err = cdiSlot(n.rc.CDIDir, ids...); err != nil {
			n.setPrepareError(p, err.Error())
			return false
		}
	}
	n.mu.Lock()
	p.Claims, p.Container, p.Running, p.PrepareError = claims, env, time.Now(), ""
	n.mu.Unlock()
	return true
}

// reportRunning writes the pod's status: Running and Ready, its containers
// started (retried on the next look when the write fails).
func (n *e2eNode) reportRunning(ctx context.Context, pod *corev1.Pod, p *e2ePod) {
	now := metav1.Now()
	st := pod.Status.DeepCopy()
	st.Phase = corev1.PodRunning
	st.StartTime = &now
	st.HostIP = "127.0.0.1"
	st.HostIPs = []corev1.HostIP{{IP: "127.0.0.1"}}
	for _, typ := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		setPodCondition(st, corev1.PodCondition{Type: typ, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	st.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image,
			ImageID: "stand-in://" + c.Image, ContainerID: "stand-in://" + string(pod.UID) + "/" + c.Name,
			Ready: true, Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
	}
	next := pod.DeepCopy()
	next.Status = *st
	if _, err := n.nodeKube.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		n.setPrepareError(p, "pod status: "+err.Error())
		return
	}
	n.mu.Lock()
	p.Reported, p.PrepareError = true, ""
	hook := n.reported
	n.mu.Unlock()
	if hook != nil {
		hook(pod)
	}
}

func setPodCondition(st *corev1.PodStatus, c corev1.PodCondition) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == c.Type {
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

func (n *e2eNode) setPrepareError(p *e2ePod, msg string) {
	n.mu.Lock()
	p.PrepareError = msg
	n.mu.Unlock()
}

func (n *e2eNode) unpreparePod(ctx context.Context, p *e2ePod) {
	n.mu.Lock()
	kl, claims := n.kl, p.Claims
	n.mu.Unlock()
	if len(claims) > 0 && kl != nil {
		req := &drav1.NodeUnprepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, claimRef(c))
		}
		uctx, cancel := context.WithTimeout(ctx, pluginClientTimeout)
		resp, err := kl.v1.NodeUnprepareResources(uctx, req)
		cancel()
		if err != nil {
			n.setPrepareError(p, "unprepare: "+err.Error())
			return
		}
		for uid, r := range resp.Claims {
			if r.Error != "" {
				n.setPrepareError(p, fmt.Sprintf("unprepare %s: %s", uid, r.Error))
				return
			}
		}
	}
	n.mu.Lock()
	p.Unprepared = true
	n.mu.Unlock()
}

// ------------------------------------------------------------ pods

// createPod creates the pod (its nodeSelector pinned to the test's nodes
// when it has none, so that the tests' nodes never mix) and returns it.
func (e *e2e) createPod(pod *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	created, err := e.c.Admin.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return created
}

// podWith is a pod using the claim (by name) or the template.
func podWith(ns, name, claim, template string) *corev1.Pod {
	pc := corev1.PodResourceClaim{Name: "qpu"}
	if claim != "" {
		pc.ResourceClaimName = &claim
	} else {
		pc.ResourceClaimTemplateName = &template
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, ResourceClaims: []corev1.PodResourceClaim{pc},
			Containers: []corev1.Container{{Name: "job", Image: "qrt-job-example:0.1.0",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "qpu"}}}}}}}
}

// waitRunning waits for the pod to run on one of the nodes and returns the
// node, what its kubelet stand-in did, and the time from created to
// Running.
func (e *e2e) waitRunning(pod *corev1.Pod, timeout time.Duration, nodes ...*e2eNode) (*e2eNode, *e2ePod, time.Duration) {
	e.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		cur, err := e.c.Admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && cur.Status.Phase == corev1.PodRunning {
			for _, n := range nodes {
				if n.name == cur.Spec.NodeName {
					p := n.pod(cur.UID)
					if p == nil || p.Running.IsZero() {
						e.t.Fatalf("pod %s is Running at the API server, and the kubelet stand-in of %s has no record of its container (%+v)",
							pod.Name, n.name, p)
					}
					return n, p, p.Running.Sub(cur.CreationTimestamp.Time)
				}
			}
			e.t.Fatalf("pod %s runs on %s, none of the test's nodes", pod.Name, cur.Spec.NodeName)
		}
		if time.Now().After(deadline) {
			var why []string
			for _, n := range nodes {
				if err == nil {
					if p := n.pod(cur.UID); p != nil && p.PrepareError != "" {
						why = append(why, n.name+": "+p.PrepareError)
					}
				}
			}
			e.t.Fatalf("pod %s is not Running after %v (%v; node %q; kubelet: %s)\nevents:\n%s\nscheduler:\n%s",
				pod.Name, timeout, err, nodeOf(cur), strings.Join(why, "; "), e.c.Events(ctx, pod.Namespace, pod.Name),
				cluster.Tail(e.c.Log("kube-scheduler"), 15))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func nodeOf(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	return p.Spec.NodeName
}

// deletePod deletes the pod and waits (up to 60 s) until it is gone: the
// kubelet stand-in unprepared its claims.
func (e *e2e) deletePod(pod *corev1.Pod) {
	e.t.Helper()
	ctx := context.Background()
	if err := e.c.Admin.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	waitFor(e.t, "pod "+pod.Name+" deleted", 60*time.Second, func() bool {
		_, err := e.c.Admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// claimOf is the pod's claim named "qpu" (the template's, once made).
func (e *e2e) claimOf(pod *corev1.Pod) *resourceapi.ResourceClaim {
	e.t.Helper()
	ctx := context.Background()
	cur, err := e.c.Admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	name := ""
	for _, pc := range cur.Spec.ResourceClaims {
		name = ptr.Deref(pc.ResourceClaimName, "")
		for _, st := range cur.Status.ResourceClaimStatuses {
			if st.Name == pc.Name && st.ResourceClaimName != nil {
				name = *st.ResourceClaimName
			}
		}
	}
	c, err := e.c.Admin.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("pod %s's claim %q: %v", pod.Name, name, err)
	}
	return c
}
