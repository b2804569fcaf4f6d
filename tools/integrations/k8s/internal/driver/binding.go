package driver

// Reserving before the pod binds (KEP-5007, binding conditions; beta in
// the v0.37 API behind DRADeviceBindingConditions and
// DRAResourceClaimDeviceStatus).  The devices are published with the
// binding condition ConditionReserved and the failure condition
// ConditionReserveFailed; the scheduler copies them into the claim's
// allocation and holds the pod before binding until the device status says
// one or the other.  This controller -- one per node, in the driver -- watches
// the claims allocated to its node's devices with those conditions,
// reserves through slots.reserve with the allocation's idempotency key
// (k8s-claim-<UID>-<random>, the request checkpointed first, as at
// prepare; relative times counted from the pod's expected start), and
// writes the reservation and the condition into the claim's device status.
// NodePrepareResources then finds the claim's checkpoint holding the same
// reservation.  A claim deleted or deallocated before it is prepared has its
// reservation released.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	qpuv1alpha1 "qrtd.io/tools/integrations/k8s/api/qpu.qrtd.io/v1alpha1"
)

// The device's binding condition and binding failure condition.
const (
	ConditionReserved      = DriverName + "/reserved"
	ConditionReserveFailed = DriverName + "/reserve-failed"
)

// DefaultBindingCheck is how often kube-scheduler looks at a waiting pod's
// binding conditions (its DynamicResources plugin's PreBind polls every
// 5 s from the allocation); DefaultPodStart is the time given to the
// kubelet to prepare the claim and start the containers after binding.
const (
	DefaultBindingCheck = 5 * time.Second
	DefaultPodStart     = 3 * time.Second
)

// podStart is when a pod whose claim is reserved now, before it binds, can
// be expected to run: relative notBefore and deadline count from it, as
// they count from the prepare where the driver reserves at prepare.  The
// scheduler binds at its first binding-condition check after the
// reservation: checks fall every BindingCheck from the allocation (whose
// timestamp the API keeps to the second: it may be up to a second
// later), and the reservation and its condition are written within a
// second from now.  The kubelet then has PodStart.
func (d *Driver) podStart(claim *resourceapi.ResourceClaim) time.Time {
	now := d.cfg.Now()
	alloc := now
	if at := claim.Status.Allocation.AllocationTimestamp; at != nil {
		alloc = at.Add(time.Second)
	}
	check := d.cfg.BindingCheck
	checks := int64(1)
	if late := now.Add(time.Second).Sub(alloc); late > check {
		checks = int64((late + check - 1) / check)
	}
	return alloc.Add(time.Duration(checks) * check).Add(d.cfg.PodStart)
}

// bindingItem is a work item: a claim to look at (by name), or a claim
// that is gone (by UID).
type bindingItem struct {
	Namespace, Name string
	Gone            types.UID
}

// wantsReserve: the claim's allocation holds devices of this node's pool
// that carry this driver's binding condition (the scheduler copied them
// from the slice), so the pod waits for a reservation before it binds.
func (d *Driver) wantsReserve(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil || claim.DeletionTimestamp != nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == DriverName && r.Pool == d.cfg.NodeName {
			for _, c := range r.BindingConditions {
				if c == ConditionReserved {
					return true
				}
			}
		}
	}
	return false
}

// BindingController runs until ctx ends.
func (d *Driver) BindingController(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("binding")
	ctx = klog.NewContext(ctx, logger)
	factory := informers.NewSharedInformerFactory(d.kube, 10*time.Minute)
	inf := factory.Resource().V1().ResourceClaims()
	// An admin's DeviceTaintRules: a claim allocated a device they taint
	// (NoSchedule or NoExecute) that it does not tolerate is not reserved.
	rules := factory.Resource().V1().DeviceTaintRules()
	rulesInf := rules.Informer()
	d.taintRules = rules.Lister()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[bindingItem](100*time.Millisecond, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[bindingItem]{Name: "qpu-binding"})
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if c, ok := obj.(*resourceapi.ResourceClaim); ok {
			queue.Add(bindingItem{Namespace: c.Namespace, Name: c.Name})
		}
	}
	_, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				queue.Add(bindingItem{Gone: c.UID})
				queue.Add(bindingItem{Namespace: c.Namespace, Name: c.Name})
			}
		},
	})
	if err != nil {
		logger.Error(err, "Cannot watch ResourceClaims: no reservation before binding")
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced, rulesInf.HasSynced) {
		return
	}
	lister := inf.Lister()
	// Claims deleted while the driver was down: their reservations go.
	d.mu.Lock()
	var orphans []types.UID
	for uid, cp := range d.claims {
		if cp.Binding {
			orphans = append(orphans, uid)
		}
	}
	d.mu.Unlock()
	for _, uid := range orphans {
		queue.Add(bindingItem{Gone: uid})
	}
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		item, quit := queue.Get()
		if quit {
			return
		}
		err := d.syncBinding(ctx, lister, item)
		if err != nil {
			logger.Info("Retrying", "claim", item, "err", err)
			queue.AddRateLimited(item)
		} else {
			queue.Forget(item)
		}
		queue.Done(item)
	}
}

func (d *Driver) syncBinding(ctx context.Context, lister resourcelisters.ResourceClaimLister, item bindingItem) error {
	if item.Gone != "" {
		return d.releaseIfUnbound(ctx, lister, item.Gone)
	}
	claim, err := lister.ResourceClaims(item.Namespace).Get(item.Name)
	if apierrors.IsNotFound(err) {
		return nil // its Gone item releases what it held
	}
	if err != nil {
		return err
	}
	if !d.wantsReserve(claim) {
		// Deallocated (the scheduler gave up) or being deleted before it
		// was prepared: what the controller booked for it goes.
		return d.releaseIfUnbound(ctx, lister, claim.UID)
	}
	defer d.lockClaim(claim.UID)()
	if failed(claim) {
		return nil // the scheduler deallocates it and tries again
	}
	d.mu.Lock()
	cp := d.claims[claim.UID]
	d.mu.Unlock()
	if cp != nil && cp.Binding && cp.AllocatedAt != allocatedAt(claim) {
		// Booked for an earlier allocation of the claim, which the
		// scheduler gave up (or the pod went) before it was prepared:
		// released, and this allocation booked anew under its own key.
		klog.FromContext(ctx).V(2).Info("Releasing the slot of an earlier allocation", "claim", klog.KObj(claim), "allocated", cp.AllocatedAt)
		if err := d.unprepareLocked(ctx, claim.UID); err != nil {
			return err
		}
		cp = nil
	}
	if group, err := d.gangOf(ctx, claim); err != nil {
		return err
	} else if group != "" {
		return d.syncGang(ctx, claim, cp, group)
	}
	if cp != nil && len(cp.Slots) > 0 {
		if !reserved(claim) {
			return d.writeBindingStatus(ctx, claim, cp, nil)
		}
		return nil
	}
	if cp == nil {
		qpus, devices, err := d.devicesOf(ctx, claim)
		if err == nil {
			var params *qpuv1alpha1.SlotParameters
			if params, err = parametersOf(claim); err == nil {
				var req Request
				start := d.podStart(claim)
				if req, err = Resolve(params, qpus, start); err == nil {
					if params.NotBefore == "" {
						req.NotBeforeNS = start.UnixNano() // not before the pod runs
					}
					cp = &Checkpoint{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name,
						Key: newIdempotencyKey(claim.UID), AllocatedAt: allocatedAt(claim),
						Request: req, Devices: devices, Binding: true}
					err = d.saveCheckpoint(cp) // write-ahead, as at prepare
					if err != nil {
						return err
					}
				}
			}
		}
		if err != nil {
			return d.writeBindingStatus(ctx, claim, nil, &bindingFailure{Reason: "InvalidRequest", Message: err.Error()})
		}
	}
	if why := d.untolerated(claim); why != "" {
		klog.FromContext(ctx).Info("Not reserving on a tainted device", "claim", klog.KObj(claim), "taint", why)
		if err := d.dropCheckpoint(claim.UID); err != nil {
			return err
		}
		return d.writeBindingStatus(ctx, claim, nil, &bindingFailure{Reason: "DeviceTainted", Message: why})
	}
	slots, err := d.reserve(ctx, cp)
	var refused *RefusedError
	if errors.As(err, &refused) {
		klog.FromContext(ctx).Info("Slot refused before binding", "claim", klog.KObj(claim), "reason", refused.Reason, "message", refused.Message)
		if err := d.dropCheckpoint(claim.UID); err != nil {
			return err
		}
		return d.writeBindingStatus(ctx, claim, nil, &bindingFailure{Reason: refused.Reason, Message: refused.Message})
	}
	if err != nil {
		return err // qrtd unreachable: retried, the same key
	}
	next := *cp
	next.Slots = slots
	if err := d.saveCheckpoint(&next); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Reserved before binding", "claim", klog.KObj(claim), "reservations", slots)
	return d.writeBindingStatus(ctx, claim, &next, nil)
}

// releaseIfUnbound releases what the controller booked for a claim that
// no longer wants it (deleted, recreated, deallocated) and that the
// kubelet never prepared.  Claims the kubelet prepared are the kubelet's
// to unprepare.
func (d *Driver) releaseIfUnbound(ctx context.Context, lister resourcelisters.ResourceClaimLister, uid types.UID) error {
	d.mu.Lock()
	cp := d.claims[uid]
	d.mu.Unlock()
	if cp == nil || !cp.Binding {
		return nil
	}
	if cur, err := lister.ResourceClaims(cp.Namespace).Get(cp.Name); err == nil && cur.UID == uid && d.wantsReserve(cur) {
		return nil
	} else if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	defer d.lockClaim(uid)()
	d.mu.Lock()
	cp = d.claims[uid]
	d.mu.Unlock()
	if cp == nil || !cp.Binding {
		return nil // prepared meanwhile
	}
	klog.FromContext(ctx).V(2).Info("Releasing the slot of a claim gone before it was prepared", "claim", klog.KRef(cp.Namespace, cp.Name), "uid", uid)
	return d.unprepareLocked(ctx, uid)
}

func hasCondition(claim *resourceapi.ResourceClaim, typ string) bool {
	any := false
	for _, st := range claim.Status.Devices {
		if st.Driver != DriverName {
			continue
		}
		if !meta.IsStatusConditionTrue(st.Conditions, typ) {
			return false
		}
		any = true
	}
	return any
}

func reserved(claim *resourceapi.ResourceClaim) bool { return hasCondition(claim, ConditionReserved) }

// failed: the failure condition is set for this allocation (one set before
// the claim was allocated again is stale: the new allocation is tried).
func failed(claim *resourceapi.ResourceClaim) bool {
	if !hasCondition(claim, ConditionReserveFailed) {
		return false
	}
	at := claim.Status.Allocation.AllocationTimestamp
	if at == nil {
		return true
	}
	for _, st := range claim.Status.Devices {
		if c := meta.FindStatusCondition(st.Conditions, ConditionReserveFailed); st.Driver == DriverName && c != nil &&
			c.LastTransitionTime.Before(at) {
			return false
		}
	}
	return true
}

type bindingFailure struct {
	Reason  string
	Message string
}

// conditionReason: a condition's reason is [A-Za-z][A-Za-z0-9_,:]*.
func conditionReason(s string) string {
	var b strings.Builder
	for i, r := range s {
		ok := r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && (r >= '0' && r <= '9' || r == '_' || r == ',' || r == ':')
		if ok {
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 {
		return "Refused"
	}
	return strings.TrimRight(b.String(), ",:")
}

// writeBindingStatus writes the binding condition (and the reservation)
// or the failure condition into the claim's device status.
func (d *Driver) writeBindingStatus(ctx context.Context, claim *resourceapi.ResourceClaim, cp *Checkpoint, f *bindingFailure) error {
	now := metav1.NewTime(d.cfg.Now())
	var conds []metav1.Condition
	if f != nil {
		msg := f.Message
		if len(msg) > 32768 {
			msg = msg[:32768]
		}
		conds = []metav1.Condition{
			{Type: ConditionReserveFailed, Status: metav1.ConditionTrue, Reason: conditionReason(f.Reason), Message: msg,
				ObservedGeneration: claim.Generation, LastTransitionTime: now},
			{Type: ConditionReserved, Status: metav1.ConditionFalse, Reason: conditionReason(f.Reason), Message: msg,
				ObservedGeneration: claim.Generation, LastTransitionTime: now},
		}
	} else {
		var ids []string
		for _, s := range cp.Slots {
			ids = append(ids, fmt.Sprintf("%d on %s at %s", s.ReservationID, s.QPU, time.Unix(0, s.StartNS).UTC().Format(time.RFC3339Nano)))
		}
		conds = []metav1.Condition{{Type: ConditionReserved, Status: metav1.ConditionTrue, Reason: "Reserved",
			Message: "qrtd holds reservation " + strings.Join(ids, ", "), ObservedGeneration: claim.Generation, LastTransitionTime: now}}
	}
	return d.recordStatus(ctx, claim, cp, conds)
}

// untolerated names a taint (NoSchedule or NoExecute) on one of the
// claim's allocated devices of this node that the allocation does not
// tolerate: the driver's own (endpoint down) or an admin's DeviceTaintRule
// (maintenance) that came after the scheduler allocated it.  "" when none.
func (d *Driver) untolerated(claim *resourceapi.ResourceClaim) string {
	var rules []*resourceapi.DeviceTaintRule
	if d.taintRules != nil {
		rules, _ = d.taintRules.List(labels.Everything())
	}
	d.res.mu.Lock()
	own := d.res.taints
	d.res.mu.Unlock()
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName || r.Pool != d.cfg.NodeName {
			continue
		}
		type source struct {
			taint resourceapi.DeviceTaint
			from  string
		}
		var taints []source
		for _, t := range own[r.Device] {
			taints = append(taints, source{t, "the driver"})
		}
		for _, rule := range rules {
			if sel := rule.Spec.DeviceSelector; sel == nil ||
				(sel.Driver == nil || *sel.Driver == DriverName) && (sel.Pool == nil || *sel.Pool == r.Pool) &&
					(sel.Device == nil || *sel.Device == r.Device) {
				taints = append(taints, source{rule.Spec.Taint, "DeviceTaintRule " + rule.Name})
			}
		}
		for _, t := range taints {
			if t.taint.Effect != resourceapi.DeviceTaintEffectNoSchedule && t.taint.Effect != resourceapi.DeviceTaintEffectNoExecute {
				continue
			}
			tolerated := false
			for _, tol := range r.Tolerations {
				tolerated = tolerated || resourceclaim.ToleratesTaint(tol, t.taint)
			}
			if !tolerated {
				return fmt.Sprintf("device %s/%s is tainted %s=%s:%s by %s, which the claim's request %s does not tolerate",
					r.Pool, r.Device, t.taint.Key, t.taint.Value, t.taint.Effect, t.from, r.Request)
			}
		}
	}
	return ""
}

// devicesOf maps the claim's allocated devices of this driver to qrtd's
// QPUs and the devices a prepare returns.
func (d *Driver) devicesOf(ctx context.Context, claim *resourceapi.ResourceClaim) ([]string, []kubeletplugin.Device, error) {
	var devices []kubeletplugin.Device
	var qpus []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		qpu, ok := d.qpuOfDevice(ctx, r.Device)
		if !ok {
			return nil, nil, fmt.Errorf("claim %s/%s: device %s/%s is no QPU of this node's qrtd", claim.Namespace, claim.Name, r.Pool, r.Device)
		}
		qpus = append(qpus, qpu)
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{CDIDeviceID(claim.UID)},
		})
	}
	return qpus, devices, nil
}
