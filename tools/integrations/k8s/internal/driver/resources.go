package driver

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"qrtd.io/tools/clients/go/qrtproto"
)

// QPU is one entry of qrtd's qpus.list (with the device facts of
// qpus.list's "device" object when the daemon has them).
type QPU struct {
	Name          string      `json:"name"`
	EndpointUp    bool        `json:"endpoint_up"`
	CalibrationID uint64      `json:"calibration_id"` // MaxUint64: none yet
	MinLeadNS     int64       `json:"min_lead_ns"`
	Device        *DeviceInfo `json:"device"`
	// The live calibration block in force, else the next (nil: none):
	// qrtd(8), CALIBRATION BLOCKS.
	CalibrationBlock *CalibrationBlock `json:"calibration_block"`
}

// CalibrationBlock is a calibration block as qrtd shows it (qpus.list,
// the calibration.* events, reservation.yield_requested).
type CalibrationBlock struct {
	BlockID uint64 `json:"block_id"`
	QPU     string `json:"qpu"`
	Step    string `json:"step"`
	State   string `json:"state"`
	StartNS int64  `json:"start_ns"`
	EndNS   int64  `json:"end_ns"`
}

// DeviceInfo: the QPU's facts, when qrtd.toml gives them.
type DeviceInfo struct {
	Qubits     *int64   `json:"qubits"`
	Technology string   `json:"technology"`
	BasisGates []string `json:"basis_gates"`
	MaxShots   *int64   `json:"max_shots"`
}

type window struct {
	CalibrationID uint64  `json:"calibration_id"`
	F0            float64 `json:"f0"`
	TauNS         int64   `json:"tau_ns"`
	ValidFromNS   int64   `json:"valid_from_ns"`
	ValidUntilNS  int64   `json:"valid_until_ns"`
}

type resourcesState struct {
	mu        sync.Mutex
	byDevice  map[string]string                    // device name -> qrtd QPU name
	health    map[string]bool                      // device name -> endpoint up
	downSince map[string]metav1.Time               // device name -> when its endpoint was first seen down
	taints    map[string][]resourceapi.DeviceTaint // device name -> the driver's own taints
	published *resourceslice.DriverResources
	changed   chan struct{} // health watchers wake on a change
	// The next time a calibration block's taint goes on or off (0: none
	// known): PublishLoop publishes again then.
	nextTaintChange int64
}

// DeviceName is the DRA device of a QPU: a DNS label (lower case,
// [a-z0-9-]), the QPU's own name in the attribute "qpu".
func DeviceName(qpu string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(qpu) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	s := strings.Trim(b.String(), "-")
	if s == "" {
		s = "qpu"
	}
	if len(s) > 63 {
		s = s[:63]
	}
	return s
}

func (d *Driver) qpuOfDevice(ctx context.Context, device string) (string, bool) {
	d.res.mu.Lock()
	q, ok := d.res.byDevice[device]
	d.res.mu.Unlock()
	if ok {
		return q, true
	}
	// Not published yet (a prepare right after a restart): ask qrtd.
	if _, err := d.Resources(ctx); err != nil {
		return "", false
	}
	d.res.mu.Lock()
	defer d.res.mu.Unlock()
	q, ok = d.res.byDevice[device]
	return q, ok
}

func intAttr(v int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: &v} }
func strAttr(v string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: &v}
}
func boolAttr(v bool) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{BoolValue: &v} }

// Resources asks qrtd for its QPUs and their calibration windows and
// builds the node's pool: one device per QPU.
func (d *Driver) Resources(ctx context.Context) (*resourceslice.DriverResources, error) {
	var list struct {
		QPUs []QPU `json:"qpus"`
	}
	if err := d.client.Call(ctx, qrtproto.MethodQpusList, nil, &list); err != nil {
		return nil, err
	}
	now := d.cfg.Now().UnixNano()
	byDevice := map[string]string{}
	health := map[string]bool{}
	taints := map[string][]resourceapi.DeviceTaint{}
	d.res.mu.Lock()
	downSince := map[string]metav1.Time{}
	for k, v := range d.res.downSince {
		downSince[k] = v
	}
	d.res.mu.Unlock()
	var devices []resourceapi.Device
	var nextChange int64
	for _, q := range list.QPUs {
		var cal struct {
			Windows []window `json:"windows"`
		}
		if err := d.client.Call(ctx, qrtproto.MethodCalibrationGet, map[string]any{"qpu": q.Name}, &cal); err != nil {
			return nil, err
		}
		name := DeviceName(q.Name)
		if other, dup := byDevice[name]; dup {
			return nil, fmt.Errorf("QPUs %q and %q map to one device name %q", other, q.Name, name)
		}
		byDevice[name] = q.Name
		health[name] = q.EndpointUp
		backlog, err := d.backlog(ctx, q.Name, now)
		if err != nil {
			return nil, err
		}
		dev := deviceOf(q, cal.Windows, now, backlog)
		if !q.EndpointUp {
			// NoSchedule while qrtd's link to the endpoint is down: no new
			// claim is allocated the QPU unless it tolerates the taint
			// (one booking ahead of the outage may).  The taint's time is
			// when the driver first saw it down, so republishing does not
			// change it.
			since, ok := downSince[name]
			if !ok {
				since = metav1.NewTime(time.Unix(0, now).Truncate(time.Second))
			}
			downSince[name] = since
			dev.Taints = []resourceapi.DeviceTaint{{Key: TaintEndpointDown, Value: q.Name,
				Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &since}}
			taints[name] = dev.Taints
		} else {
			delete(downSince, name)
		}
		// NoSchedule for a live calibration block, from when a claim
		// allocated now would run inside it (the binding check and the
		// pod's start ahead of it) to its end: new claims go to another
		// QPU, or wait.  The taint's time is the block's start.
		if b := q.CalibrationBlock; b != nil && qrtproto.BlockIsLive(b.State) && now < b.EndNS {
			from := b.StartNS - d.taintLead().Nanoseconds()
			if now >= from {
				since := metav1.NewTime(time.Unix(0, b.StartNS).Truncate(time.Second))
				dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{Key: TaintCalibration,
					Value:  fmt.Sprintf("%s.block-%d", DeviceName(q.Name), b.BlockID),
					Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &since})
				taints[name] = dev.Taints
				nextChange = earliest(nextChange, b.EndNS)
			} else {
				nextChange = earliest(nextChange, from)
			}
		}
		if d.cfg.BindingConditions {
			// The scheduler holds the pod until the controller reserved
			// (binding.go).  The slice is the node's: BindsToNode is not
			// needed.
			dev.BindingConditions = []string{ConditionReserved}
			dev.BindingFailureConditions = []string{ConditionReserveFailed}
		}
		devices = append(devices, dev)
	}
	for name := range downSince {
		if _, ok := byDevice[name]; !ok {
			delete(downSince, name)
		}
	}
	d.res.mu.Lock()
	d.res.byDevice = byDevice
	d.res.health = health
	d.res.downSince = downSince
	d.res.taints = taints
	d.res.nextTaintChange = nextChange
	d.res.mu.Unlock()
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}, nil
}

// TaintEndpointDown is the driver's taint (NoSchedule, the value the QPU's
// name) on a device while qrtd's link to the QPU's endpoint is down.
const TaintEndpointDown = DriverName + "/endpoint-down"

// TaintCalibration is the driver's taint (NoSchedule, the value
// "<device>.block-<block id>") on a device from taintLead before a
// calibration block qrtd granted until its end.
const TaintCalibration = DriverName + "/calibration"

// taintLead: how long before a calibration block its taint goes on -- the
// time from a claim's allocation to its pod running (the scheduler's
// binding check and the pod's start), so that a claim allocated now is not
// given a QPU that calibrates when its pod runs.
func (d *Driver) taintLead() time.Duration { return d.cfg.BindingCheck + d.cfg.PodStart }

// earliest of two times, 0 meaning none.
func earliest(a, b int64) int64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// backlogSteps are the values the attribute backlogMs takes: the wait is
// rounded down to one of them, so that the slice changes when the wait
// crosses a step, not with every booking.
var backlogSteps = []time.Duration{0, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
	20 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute,
	20 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour}

// backlog is how long a new booking on the QPU would wait: the earliest
// start qrtd offers a slot of the smallest length (slots.query, 1 µs),
// from now, rounded down to a backlogSteps; none within qrtd's horizon:
// the last step.
func (d *Driver) backlog(ctx context.Context, qpu string, now int64) (time.Duration, error) {
	var q struct {
		Candidates []struct {
			StartNS int64 `json:"start_ns"`
		} `json:"candidates"`
	}
	if err := d.client.Call(ctx, qrtproto.MethodSlotsQuery, map[string]any{"duration_ns": 1000, "qpus": []string{qpu},
		"max_candidates": 1}, &q); err != nil {
		return 0, err
	}
	wait := backlogSteps[len(backlogSteps)-1]
	if len(q.Candidates) > 0 {
		wait = time.Duration(max(0, q.Candidates[0].StartNS-now))
	}
	step := backlogSteps[0]
	for _, s := range backlogSteps {
		if s <= wait {
			step = s
		}
	}
	return step, nil
}

// deviceOf is the DRA device of one QPU: qrtd's facts as attributes.
func deviceOf(q QPU, windows []window, now int64, backlog time.Duration) resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"qpu":        strAttr(q.Name),
		"minLeadNs":  intAttr(q.MinLeadNS),
		"endpointUp": boolAttr(q.EndpointUp),
		"backlogMs":  intAttr(backlog.Milliseconds()),
	}
	if q.CalibrationID <= math.MaxInt64 {
		attrs["calibrationId"] = intAttr(int64(q.CalibrationID))
	}
	if q.Device != nil {
		if q.Device.Qubits != nil {
			attrs["qubits"] = intAttr(*q.Device.Qubits)
		}
		if q.Device.Technology != "" {
			attrs["technology"] = strAttr(q.Device.Technology)
		}
		if q.Device.MaxShots != nil {
			attrs["maxShots"] = intAttr(*q.Device.MaxShots)
		}
	}
	// The current (or next) window: its id, predicted fidelity (f0, in
	// parts per million: attributes hold no floats), and the period
	// between window starts.
	var cur *window
	for i := range windows {
		if windows[i].ValidUntilNS > now {
			cur = &windows[i]
			break
		}
	}
	if cur != nil {
		if cur.CalibrationID <= math.MaxInt64 {
			attrs["windowCalibrationId"] = intAttr(int64(cur.CalibrationID))
		}
		attrs["predictedFidelityPpm"] = intAttr(int64(math.Round(cur.F0 * 1e6)))
		attrs["windowUntilNs"] = intAttr(cur.ValidUntilNS)
	}
	if len(windows) >= 2 {
		attrs["windowPeriodNs"] = intAttr(windows[1].ValidFromNS - windows[0].ValidFromNS)
	}
	return resourceapi.Device{
		Name:       DeviceName(q.Name),
		Attributes: attrs,
		// A QPU is shared in time: many claims are allocated to one
		// device, and qrtd keeps their slots apart
		// (DRAConsumableCapacity).
		AllowMultipleAllocations: ptr.To(true),
	}
}

// Publisher is what publishes the pool (the kubeletplugin Helper).
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// Publish builds the pool and hands it to p when it changed (or always,
// with force: after a kubelet registration, which deletes the node's
// slices).
func (d *Driver) Publish(ctx context.Context, p Publisher, force bool) error {
	res, err := d.Resources(ctx)
	if err != nil {
		return err
	}
	d.res.mu.Lock()
	same := d.res.published != nil && reflect.DeepEqual(d.res.published, res)
	if !same {
		d.res.published = res
		if d.res.changed != nil {
			close(d.res.changed)
			d.res.changed = nil
		}
	}
	d.res.mu.Unlock()
	if same && !force {
		return nil
	}
	klog.FromContext(ctx).V(2).Info("Publishing ResourceSlice", "devices", len(res.Pools[d.cfg.NodeName].Slices[0].Devices), "force", force)
	return p.PublishResources(ctx, *res)
}

// WatchHealthStatus reports each QPU's health to the kubelet: healthy
// while qrtd's link to its endpoint is up.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	for {
		d.res.mu.Lock()
		if d.res.changed == nil {
			d.res.changed = make(chan struct{})
		}
		changed := d.res.changed
		var rep kubeletplugin.DeviceHealthReport
		for dev, up := range d.res.health {
			h := kubeletplugin.HealthStatusUnhealthy
			msg := "qrtd: QPU endpoint down"
			if up {
				h, msg = kubeletplugin.HealthStatusHealthy, "qrtd: QPU endpoint up"
			}
			rep.Devices = append(rep.Devices, kubeletplugin.DeviceHealth{PoolName: d.cfg.NodeName,
				DeviceName: dev, Health: h, LastUpdated: d.cfg.Now(), Message: msg,
				HealthCheckTimeout: 3 * d.cfg.Poll})
		}
		d.res.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case reports <- rep:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-time.After(d.cfg.Poll):
		}
	}
}

// PublishLoop publishes on every calibration change qrtd pushes (the
// event loop signals calibration), every Poll (endpoint up/down), and
// whenever kick fires (a kubelet registration: force).
func (d *Driver) PublishLoop(ctx context.Context, p Publisher, kick, calibration <-chan struct{}) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	publish := func(force bool) {
		if err := d.Publish(ctx, p, force); err != nil {
			logger.Error(err, "Publishing the QPUs failed")
		}
	}
	publish(true)
	for {
		// A calibration block's taint goes on or off at a time of its own:
		// publish then, not a poll later.
		var at <-chan time.Time
		var timer *time.Timer
		d.res.mu.Lock()
		next := d.res.nextTaintChange
		d.res.mu.Unlock()
		if next != 0 {
			wait := time.Duration(next-d.cfg.Now().UnixNano()) + time.Millisecond
			timer = time.NewTimer(max(wait, 0))
			at = timer.C
		}
		select {
		case <-ctx.Done():
		case <-calibration:
			publish(false)
		case <-kick:
			publish(true)
		case <-t.C:
			publish(false)
		case <-at:
			publish(false)
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// EventLoop is the driver's one subscription to qrtd's events, until ctx
// ends: calibration.changed and the calibration blocks' events (signalled
// on calibration: the slice is published again) and, as a delegate,
// job.finished of every tenant it books for, relayed to the claim sockets
// whose reservation it is, and reservation.yield_requested, written into
// the claim's status (recordYield).  It
// subscribes again (every Poll) while qrtd is away, and signals
// calibration then: what changed meanwhile was not pushed.
func (d *Driver) EventLoop(ctx context.Context, calibration chan<- struct{}) {
	logger := klog.FromContext(ctx)
	signal := func() {
		select {
		case calibration <- struct{}{}:
		default:
		}
	}
	failed := false
	for ctx.Err() == nil {
		events, err := d.client.Subscribe(ctx, []string{qrtproto.EventCalibrationChanged, qrtproto.EventJobFinished,
			qrtproto.EventCalibrationScheduled, qrtproto.EventCalibrationStarted, qrtproto.EventCalibrationEnded,
			qrtproto.EventReservationYieldRequested}, true)
		if err != nil {
			if !failed {
				logger.Info("Cannot subscribe to qrtd's events (retrying every --poll): the slice is published every --poll, claim sockets hear no job.finished", "err", err)
			}
			failed = true
			select {
			case <-ctx.Done():
				return
			case <-time.After(d.cfg.Poll):
			}
			continue
		}
		if failed {
			logger.Info("Subscribed to qrtd's events again")
			failed = false
		}
		signal()
		for ev := range events {
			switch ev.Type {
			case qrtproto.EventCalibrationChanged, qrtproto.EventCalibrationScheduled,
				qrtproto.EventCalibrationStarted, qrtproto.EventCalibrationEnded:
				signal()
			case qrtproto.EventJobFinished:
				d.relayFinished(ev)
			case qrtproto.EventReservationYieldRequested:
				d.recordYield(ctx, ev)
			}
		}
	}
}
