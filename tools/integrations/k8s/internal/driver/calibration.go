package driver

// A calibration block's request to yield (qrtd(8), CALIBRATION BLOCKS):
// qrtd asks the holder of a held reservation in a requested block's time to
// release or move it by a deadline.  The driver holds claims' reservations
// as a delegate, so it hears reservation.yield_requested for them and
// writes it into the claim's status, where the claim's owner (and kubectl
// describe) sees it.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"qrtd.io/tools/clients/go/qrtd"
)

// ConditionYieldRequested is set on the claim's device while qrtd asks
// its slot back for a calibration block: Reason CalibrationBlock, the
// message naming the block, the deadline, the nearest free start and
// what happens at the deadline (revoked, or kept and the block fails).
const ConditionYieldRequested = DriverName + "/yield-requested"

// YieldRequest is the data of a reservation.yield_requested event.
type YieldRequest struct {
	ReservationID uint64           `json:"reservation_id"`
	QPU           string           `json:"qpu"`
	StartNS       int64            `json:"start_ns"`
	DeadlineNS    int64            `json:"deadline_ns"`
	FreeStartNS   int64            `json:"free_start_ns"`
	AtDeadline    string           `json:"at_deadline"`
	Block         CalibrationBlock `json:"block"`
}

func utc(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// Message is the condition's message.
func (y YieldRequest) Message() string {
	free := "qrtd knows no free start for it"
	if y.FreeStartNS > 0 {
		free = "the nearest free start is " + utc(y.FreeStartNS)
	}
	then := "it is kept and the block fails"
	if y.AtDeadline == "revoke" {
		then = "it is revoked (its fencing token dead)"
	}
	return fmt.Sprintf("qrtd asks reservation %d on QPU %s back by %s for calibration block %d (step %s) from %s to %s; %s; "+
		"if it is neither released nor moved by then, %s", y.ReservationID, y.QPU, utc(y.DeadlineNS), y.Block.BlockID,
		y.Block.Step, utc(y.Block.StartNS), utc(y.Block.EndNS), free, then)
}

// recordYield writes a yield request into the status of the claim whose
// slot it names (one the driver holds for the event's tenant's namespace).
func (d *Driver) recordYield(ctx context.Context, ev qrtd.Event) {
	var y YieldRequest
	if json.Unmarshal(ev.Data, &y) != nil || y.ReservationID == 0 {
		return
	}
	var cp *Checkpoint
	d.mu.Lock()
	for _, c := range d.claims {
		if !strings.HasSuffix(ev.Tenant, "/"+c.Namespace) {
			continue
		}
		for _, s := range c.Slots {
			if s.ReservationID == y.ReservationID {
				cp = c
			}
		}
	}
	d.mu.Unlock()
	if cp == nil {
		return
	}
	logger := klog.FromContext(ctx)
	logger.Info("qrtd asks a claim's slot back for a calibration block", "claim", klog.KRef(cp.Namespace, cp.Name),
		"reservation", y.ReservationID, "block", y.Block.BlockID, "deadline", utc(y.DeadlineNS), "atDeadline", y.AtDeadline)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: cp.Namespace, Name: cp.Name, UID: cp.UID}}
	cond := metav1.Condition{Type: ConditionYieldRequested, Status: metav1.ConditionTrue, Reason: "CalibrationBlock",
		Message: y.Message(), LastTransitionTime: metav1.NewTime(d.cfg.Now())}
	if err := d.recordStatus(ctx, claim, nil, []metav1.Condition{cond}); err != nil {
		logger.Error(err, "Could not write the yield request into the claim's status", "claim", klog.KRef(cp.Namespace, cp.Name))
	}
}
