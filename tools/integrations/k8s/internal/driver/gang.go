package driver

// A gang across QPU nodes: the pods of one PodGroup with a gang policy
// (scheduling.k8s.io/v1beta1, gang scheduling, beta in 1.37), each with
// its claim of a QPU on its own node, get slots that start at the same
// instant, or none is bound.  Node drivers cannot agree alone, so the gang
// controller (gangcontroller.go, one for the cluster) leads, through the
// API, the rounds qrtd(8) describes for the Slurm plugin's multi-node
// steps: it plans a start S for the whole group; each node's driver holds
// exactly [S, S + duration) on its QPU (slots.reserve with not_before_ns S
// and deadline_ns S + duration) and reports held, or refused with the next
// start its QPU could give; all held: commit, each driver sets its claim's
// binding condition and the scheduler binds the pods; one refused: a new
// round at the latest next start, each driver releasing its earlier hold;
// no next start, the claim's own deadline passed, or MaxGangRounds
// rounds: abort, every hold released, every claim's binding failure
// condition set, and the scheduler deallocates the claims and tries again.
//
// The wire, all in the ResourceClaims:
//
//   - the plan: the annotation qpu.qrtd.io/gang, written by the gang
//     controller on each member claim: {"group", "round", "startNs",
//     "state": hold|commit|abort, "reason", "allocatedAt"} (allocatedAt
//     the member's allocation it is for: a claim allocated again waits for
//     a new plan);
//   - the report: the condition qpu.qrtd.io/gang-held in the claim's
//     device status, written by the node's driver (True: held, reason
//     Held; False: refused, reason qrtd's or Deadline, DeviceTainted), the
//     device status data saying the round it answers (gangRound), the
//     reservation, and for a refusal nextStartNs.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// The gang protocol's annotation (the plan) and condition (the report).
const (
	AnnotationGang    = DriverName + "/gang"
	ConditionGangHeld = DriverName + "/gang-held"
)

// The plan's states.
const (
	GangHold   = "hold"
	GangCommit = "commit"
	GangAbort  = "abort"
)

// MaxGangRounds bounds the rounds of one allocation of a gang.
const MaxGangRounds = 4

// maxGangCache bounds the driver's cache of pods' gangs (by pod UID).
const maxGangCache = 4096

// GangPlan is the gang controller's annotation on a member claim.
type GangPlan struct {
	Group       string `json:"group"`
	Round       int    `json:"round"`
	StartNS     int64  `json:"startNs"`
	State       string `json:"state"`
	Reason      string `json:"reason,omitempty"`
	AllocatedAt string `json:"allocatedAt"`
}

// gangPlanOf is the claim's plan (nil: none, or not for this allocation).
func gangPlanOf(claim *resourceapi.ResourceClaim) *GangPlan {
	raw, ok := claim.Annotations[AnnotationGang]
	if !ok {
		return nil
	}
	var p GangPlan
	if json.Unmarshal([]byte(raw), &p) != nil || p.AllocatedAt != allocatedAt(claim) {
		return nil
	}
	return &p
}

// gangOf is the PodGroup (its name) of the pod the claim is reserved for,
// when that group has a gang policy of more than one pod: "" otherwise.
func (d *Driver) gangOf(ctx context.Context, claim *resourceapi.ResourceClaim) (string, error) {
	if d.kube == nil || len(claim.Status.ReservedFor) == 0 {
		return "", nil
	}
	r := claim.Status.ReservedFor[0]
	if r.Resource != "pods" || r.APIGroup != "" {
		return "", nil
	}
	d.mu.Lock()
	group, known := d.gangs[r.UID]
	d.mu.Unlock()
	if known {
		return group, nil
	}
	pod, err := d.kube.CoreV1().Pods(claim.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if pod.UID == r.UID && pod.Spec.SchedulingGroup != nil && pod.Spec.SchedulingGroup.PodGroupName != nil {
		pg, err := d.kube.SchedulingV1beta1().PodGroups(claim.Namespace).Get(ctx, *pod.Spec.SchedulingGroup.PodGroupName, metav1.GetOptions{})
		switch {
		case err == nil:
			if g := pg.Spec.SchedulingPolicy.Gang; g != nil && g.MinCount > 1 {
				group = pg.Name
			}
		case !apierrors.IsNotFound(err):
			return "", err
		}
	}
	d.mu.Lock()
	if len(d.gangs) >= maxGangCache {
		clear(d.gangs) // a cache: looked up again
	}
	d.gangs[r.UID] = group
	d.mu.Unlock()
	return group, nil
}

// syncGang is the node's part of a gang member's round (d.lockClaim held).
func (d *Driver) syncGang(ctx context.Context, claim *resourceapi.ResourceClaim, cp *Checkpoint, group string) error {
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim), "group", group)
	plan := gangPlanOf(claim)
	if plan == nil || plan.Group != group {
		return nil // the gang controller plans once every member is allocated
	}
	held := cp != nil && cp.GangRound == plan.Round && len(cp.Slots) > 0
	switch plan.State {
	case GangAbort:
		if cp != nil && cp.Binding {
			if err := d.unprepareLocked(ctx, claim.UID); err != nil {
				return err
			}
		}
		return d.writeBindingStatus(ctx, claim, nil, &bindingFailure{Reason: "GangAborted", Message: plan.Reason})
	case GangCommit:
		if !held {
			return d.writeBindingStatus(ctx, claim, nil, &bindingFailure{Reason: "GangLost",
				Message: fmt.Sprintf("gang %s committed round %d, which this node holds nothing for", group, plan.Round)})
		}
		if reserved(claim) {
			return nil
		}
		logger.V(2).Info("Gang committed", "round", plan.Round, "start", time.Unix(0, plan.StartNS).UTC())
		return d.writeBindingStatus(ctx, claim, cp, nil)
	case GangHold:
	default:
		return nil
	}
	if held {
		if reportedRound(claim, true) == plan.Round {
			return nil
		}
		return d.reportGang(ctx, claim, cp, plan.Round, nil)
	}
	if reportedRound(claim, false) == plan.Round {
		return nil // refused this round already: the controller decides
	}
	if cp != nil && cp.GangRound != plan.Round {
		// A hold of an earlier round: released before this round's.
		if err := d.unprepareLocked(ctx, claim.UID); err != nil {
			return err
		}
		cp = nil
	}
	if cp == nil {
		qpus, devices, err := d.devicesOf(ctx, claim)
		if err != nil {
			return d.reportGang(ctx, claim, nil, plan.Round, &RefusedError{Reason: "InvalidRequest", Message: err.Error()})
		}
		params, err := parametersOf(claim)
		var req Request
		if err == nil {
			req, err = Resolve(params, qpus, d.podStart(claim))
		}
		if err != nil {
			return d.reportGang(ctx, claim, nil, plan.Round, &RefusedError{Reason: "InvalidRequest", Message: err.Error()})
		}
		// Exactly the plan's start: the only slot it may take.
		if req.DeadlineNS != 0 && plan.StartNS+req.DurationNS > req.DeadlineNS {
			return d.reportGang(ctx, claim, nil, plan.Round, &RefusedError{Reason: "Deadline",
				Message: fmt.Sprintf("claim %s/%s: the gang's start %s leaves less than its duration before the claim's deadline %s",
					claim.Namespace, claim.Name, time.Unix(0, plan.StartNS).UTC().Format(time.RFC3339Nano),
					time.Unix(0, req.DeadlineNS).UTC().Format(time.RFC3339Nano))})
		}
		req.NotBeforeNS, req.DeadlineNS = plan.StartNS, plan.StartNS+req.DurationNS
		cp = &Checkpoint{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name,
			Key: newIdempotencyKey(claim.UID), AllocatedAt: allocatedAt(claim), Request: req, Devices: devices,
			Binding: true, GangRound: plan.Round}
		if err := d.saveCheckpoint(cp); err != nil {
			return err
		}
	}
	if why := d.untolerated(claim); why != "" {
		if err := d.dropCheckpoint(claim.UID); err != nil {
			return err
		}
		return d.reportGang(ctx, claim, nil, plan.Round, &RefusedError{Reason: "DeviceTainted", Message: why})
	}
	slots, err := d.reserve(ctx, cp)
	var refused *RefusedError
	if errors.As(err, &refused) {
		logger.Info("Gang slot refused", "round", plan.Round, "reason", refused.Reason, "next", refused.NextStartNS)
		if err := d.dropCheckpoint(claim.UID); err != nil {
			return err
		}
		return d.reportGang(ctx, claim, nil, plan.Round, refused)
	}
	if err != nil {
		return err
	}
	next := *cp
	next.Slots = slots
	if err := d.saveCheckpoint(&next); err != nil {
		return err
	}
	logger.V(2).Info("Gang slot held", "round", plan.Round, "reservations", slots)
	return d.reportGang(ctx, claim, &next, plan.Round, nil)
}

// reportGang writes the node's answer to a round: held (cp), or refused.
func (d *Driver) reportGang(ctx context.Context, claim *resourceapi.ResourceClaim, cp *Checkpoint, round int, refused *RefusedError) error {
	now := metav1.NewTime(d.cfg.Now())
	c := metav1.Condition{Type: ConditionGangHeld, Status: metav1.ConditionTrue, Reason: "Held",
		ObservedGeneration: claim.Generation, LastTransitionTime: now}
	report := &SlotStatus{GangRound: round}
	if refused != nil {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, conditionReason(refused.Reason), truncate(refused.Message, 32768)
		report.NextStartNS = refused.NextStartNS
	} else {
		c.Message = fmt.Sprintf("round %d: held from %s", round, time.Unix(0, lastStart(cp.Slots)).UTC().Format(time.RFC3339Nano))
	}
	return d.recordStatusWith(ctx, claim, cp, []metav1.Condition{c}, report)
}

func lastStart(slots []Slot) int64 {
	var s int64
	for _, x := range slots {
		s = max(s, x.StartNS)
	}
	return s
}

// gangReport is a member's answer in its device status: the round, held
// or not, and the next start of a refusal (round 0: none).
func gangReport(claim *resourceapi.ResourceClaim) (round int, held bool, next int64, why string) {
	for _, st := range claim.Status.Devices {
		if st.Driver != DriverName {
			continue
		}
		c := meta.FindStatusCondition(st.Conditions, ConditionGangHeld)
		if c == nil || st.Data == nil {
			return 0, false, 0, ""
		}
		var s SlotStatus
		if json.Unmarshal(st.Data.Raw, &s) != nil {
			return 0, false, 0, ""
		}
		return s.GangRound, c.Status == metav1.ConditionTrue, s.NextStartNS, c.Reason + ": " + c.Message
	}
	return 0, false, 0, ""
}

// reportedRound is the round the member reported held (or refused), 0
// when none.
func reportedRound(claim *resourceapi.ResourceClaim, held bool) int {
	r, h, _, _ := gangReport(claim)
	if h != held {
		return 0
	}
	return r
}
