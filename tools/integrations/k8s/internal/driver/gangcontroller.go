package driver

// The gang controller: one for the cluster (qrt-dra-driver
// --gang-controller, deploy/gang-controller.yaml), leading the rounds of
// gang.go through the API.  It reaches no qrtd: each node's driver holds
// and reports; the controller plans, commits or aborts.

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1beta1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// GangConfig is the gang controller's: how it foresees the pods' start
// (as the node drivers do, binding.go's podStart) for the first round.
type GangConfig struct {
	BindingCheck time.Duration
	PodStart     time.Duration
	Now          func() time.Time
}

type gangController struct {
	kube kubernetes.Interface
	cfg  GangConfig
	// A Driver of no node: podStart's formula, nothing else.
	d *Driver
}

// RunGangController runs the gang controller until ctx ends.
func RunGangController(ctx context.Context, kube kubernetes.Interface, cfg GangConfig) error {
	logger := klog.FromContext(ctx).WithName("gang")
	ctx = klog.NewContext(ctx, logger)
	if cfg.BindingCheck <= 0 {
		cfg.BindingCheck = DefaultBindingCheck
	}
	if cfg.PodStart <= 0 {
		cfg.PodStart = DefaultPodStart
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if _, err := kube.Discovery().ServerResourcesForGroupVersion("scheduling.k8s.io/v1beta1"); err != nil {
		return fmt.Errorf("the API server does not serve scheduling.k8s.io/v1beta1 (PodGroups: feature gate GenericWorkload): %w", err)
	}
	g := &gangController{kube: kube, cfg: cfg,
		d: &Driver{cfg: Config{BindingCheck: cfg.BindingCheck, PodStart: cfg.PodStart, Now: cfg.Now}}}
	factory := informers.NewSharedInformerFactory(kube, 10*time.Minute)
	claims := factory.Resource().V1().ResourceClaims()
	pods := factory.Core().V1().Pods()
	groups := factory.Scheduling().V1beta1().PodGroups()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "qpu-gang"})
	defer queue.ShutDown()
	// A claim or a pod: its pod's group; a PodGroup: itself.
	enqueuePod := func(pod *corev1.Pod) {
		if sg := pod.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
			queue.Add(types.NamespacedName{Namespace: pod.Namespace, Name: *sg.PodGroupName})
		}
	}
	podLister := pods.Lister()
	handler := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		switch o := obj.(type) {
		case *resourceapi.ResourceClaim:
			for _, r := range o.Status.ReservedFor {
				if r.Resource == "pods" {
					if pod, err := podLister.Pods(o.Namespace).Get(r.Name); err == nil {
						enqueuePod(pod)
					}
				}
			}
		case *corev1.Pod:
			enqueuePod(o)
		default:
			if m, err := metaOf(obj); err == nil {
				queue.Add(types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()})
			}
		}
	}
	for _, inf := range []cache.SharedIndexInformer{claims.Informer(), pods.Informer(), groups.Informer()} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: handler,
			UpdateFunc: func(_, o any) { handler(o) }, DeleteFunc: handler}); err != nil {
			return err
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), claims.Informer().HasSynced, pods.Informer().HasSynced, groups.Informer().HasSynced) {
		return nil
	}
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	logger.Info("Leading QPU gangs")
	for {
		key, quit := queue.Get()
		if quit {
			return nil
		}
		err := g.sync(ctx, key, claims.Lister(), podLister, groups.Lister())
		if apierrors.IsConflict(err) {
			logger.V(3).Info("Retrying after a conflict", "group", key, "err", err)
			queue.AddRateLimited(key)
		} else if err != nil {
			logger.Info("Retrying", "group", key, "err", err)
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

func metaOf(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", obj)
	}
	return m, nil
}

// awaitingBinding: allocated to devices of this driver that carry its
// binding condition, not reserved, not failed.
func awaitingBinding(c *resourceapi.ResourceClaim) bool {
	if c.Status.Allocation == nil || c.DeletionTimestamp != nil || reserved(c) || failed(c) {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == DriverName {
			for _, bc := range r.BindingConditions {
				if bc == ConditionReserved {
					return true
				}
			}
		}
	}
	return false
}

func (g *gangController) sync(ctx context.Context, key types.NamespacedName, claimLister resourcelisters.ResourceClaimLister,
	podLister corelisters.PodLister, groupLister schedulinglisters.PodGroupLister) error {
	pg, err := groupLister.PodGroups(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	gang := pg.Spec.SchedulingPolicy.Gang
	if gang == nil || gang.MinCount < 2 {
		return nil
	}
	all, err := claimLister.ResourceClaims(key.Namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	// The members: claims reserved for the group's pods, awaiting their
	// binding condition.
	var members []*resourceapi.ResourceClaim
	pods := map[types.UID]bool{}
	for _, c := range all {
		if !awaitingBinding(c) || len(c.Status.ReservedFor) == 0 || c.Status.ReservedFor[0].Resource != "pods" {
			continue
		}
		pod, err := podLister.Pods(key.Namespace).Get(c.Status.ReservedFor[0].Name)
		if err != nil || pod.UID != c.Status.ReservedFor[0].UID || pod.Spec.SchedulingGroup == nil ||
			pod.Spec.SchedulingGroup.PodGroupName == nil || *pod.Spec.SchedulingGroup.PodGroupName != pg.Name {
			continue
		}
		members = append(members, c)
		pods[pod.UID] = true
	}
	if len(pods) < int(gang.MinCount) {
		return nil // the scheduler lets the gang through together: the rest come
	}
	sort.Slice(members, func(i, j int) bool { return members[i].Name < members[j].Name })
	// The round in progress: the latest plan a member carries for its
	// allocation.  A member without it (the plan was being written, or it
	// was allocated again) gets it first; none has one: a new round.
	var cur *GangPlan
	lastRound := 0
	for _, c := range members {
		if raw, ok := c.Annotations[AnnotationGang]; ok {
			var old GangPlan
			if json.Unmarshal([]byte(raw), &old) == nil {
				lastRound = max(lastRound, old.Round)
			}
		}
		if p := gangPlanOf(c); p != nil && (cur == nil || p.Round > cur.Round || p.Round == cur.Round && p.State != GangHold) {
			cur = p
		}
	}
	logger := klog.FromContext(ctx).WithValues("group", key)
	if cur == nil {
		start := time.Time{}
		for _, c := range members {
			if s := g.d.podStart(c); s.After(start) {
				start = s
			}
		}
		round := lastRound + 1
		logger.V(2).Info("Planning", "round", round, "start", start.UTC(), "members", len(members))
		return g.plan(ctx, members, GangPlan{Group: pg.Name, Round: round, StartNS: start.UnixNano(), State: GangHold})
	}
	var behind []*resourceapi.ResourceClaim
	for _, c := range members {
		if p := gangPlanOf(c); p == nil || p.Round != cur.Round || p.State != cur.State {
			behind = append(behind, c)
		}
	}
	if len(behind) > 0 {
		return g.plan(ctx, behind, *cur)
	}
	if cur.State != GangHold {
		return nil // committed or aborted: the node drivers act
	}
	held, answered := 0, 0
	var next int64
	var why string
	for _, c := range members {
		round, ok, n, reason := gangReport(c)
		if round != cur.Round {
			continue
		}
		answered++
		if ok {
			held++
			continue
		}
		if n == 0 {
			next = -1 // this member can give no start at all
			why = fmt.Sprintf("claim %s: %s", c.Name, reason)
		} else if next >= 0 {
			next = max(next, n)
			why = fmt.Sprintf("claim %s: %s", c.Name, reason)
		}
	}
	switch {
	case held == len(members):
		logger.V(2).Info("Committing", "round", cur.Round, "start", time.Unix(0, cur.StartNS).UTC())
		c := *cur
		c.State = GangCommit
		return g.plan(ctx, members, c)
	case answered < len(members) && next >= 0:
		return nil // waiting for the others' answers
	case next < 0 || cur.Round >= MaxGangRounds:
		c := *cur
		c.State = GangAbort
		c.Reason = fmt.Sprintf("gang %s/%s: no common start after round %d: %s", key.Namespace, pg.Name, cur.Round, why)
		logger.Info("Aborting", "round", cur.Round, "why", why)
		return g.plan(ctx, members, c)
	default:
		start := max(next, cur.StartNS)
		logger.V(2).Info("Next round", "round", cur.Round+1, "start", time.Unix(0, start).UTC(), "why", why)
		return g.plan(ctx, members, GangPlan{Group: pg.Name, Round: cur.Round + 1, StartNS: start, State: GangHold})
	}
}

// plan writes the plan on every member claim (each with its own
// allocation).
func (g *gangController) plan(ctx context.Context, members []*resourceapi.ResourceClaim, p GangPlan) error {
	for _, c := range members {
		mp := p
		mp.AllocatedAt = allocatedAt(c)
		val, _ := json.Marshal(mp)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": c.ResourceVersion, "annotations": map[string]string{AnnotationGang: string(val)}}})
		if _, err := g.kube.ResourceV1().ResourceClaims(c.Namespace).Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return err // a conflict: the claim changed since it was read
		}
	}
	return nil
}
