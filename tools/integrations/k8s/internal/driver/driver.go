// Package driver is qrt-dra-driver: a Kubernetes DRA driver that turns a
// ResourceClaim for the DeviceClass qpu.qrtd.io into a QPU time slot,
// reserved from the node's qrtd on behalf of the claim's namespace.
package driver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"qrtd.io/tools/clients/go/qrtd"
	"qrtd.io/tools/clients/go/qrtproto"
)

// DriverName is the DRA driver's name, its DeviceClass's selector and
// the domain of its device attributes.
const DriverName = "qpu.qrtd.io"

// CDI device kind: qrtd.io/qpu=<claim UID>.
const (
	CDIVendor = "qrtd.io"
	CDIClass  = "qpu"
	CDIKind   = CDIVendor + "/" + CDIClass
)

// Config is what the driver is started with (qrt-dra-driver's flags).
type Config struct {
	NodeName string
	// qrtd's socket as the driver reaches it, and where the containers
	// find their claim's socket (QRT_SOCKET; its directory is the bind
	// mount of the claim's directory, HostStateDir/claims/<uid>).
	Socket          string
	ContainerSocket string
	// The state directory as the host (the container runtime) sees it,
	// when the driver's container mounts it elsewhere (default StateDir).
	HostStateDir string
	// The limits of each claim's socket.
	Proxy ProxyLimits
	// Publish the devices with binding conditions and reserve before the
	// pod binds (binding.go); false: reserve at NodePrepareResources.
	BindingConditions bool
	// Where the CDI specs go (the runtime reads them) and the claims'
	// checkpoints (plugin data directory).
	CDIDir   string
	StateDir string
	// When a pod can be expected to run, for a claim reserved before its
	// pod binds: the scheduler checks binding conditions every
	// BindingCheck (5 s, kube-scheduler's own period) from the allocation
	// and binds at the first check after the reservation; the kubelet then
	// prepares the claim and starts the containers within PodStart.
	BindingCheck time.Duration
	PodStart     time.Duration
	// The reservation's lease; the driver heartbeats every Lease/3.
	Lease time.Duration
	// How often qpus.list is polled for endpoint up/down (calibration
	// changes are pushed by qrtd).
	Poll time.Duration
	Now  func() time.Time
}

// Slot is a prepared claim's reservation (one per QPU of a gang).
type Slot struct {
	ReservationID uint64 `json:"reservation_id"`
	QPU           string `json:"qpu"`
	StartNS       int64  `json:"start_ns"`
	EndNS         int64  `json:"end_ns"`
	FencingToken  uint64 `json:"fencing_token"`
	CalibrationID uint64 `json:"calibration_id"`
	Tenant        string `json:"tenant"`
	// "held" while qrtd holds it for the claim (heartbeated); "committed"
	// once the pod's job is in it, or "gone" once qrtd says it holds it no
	// more: nothing is heartbeated or released then.
	State        string `json:"state"`
	LeaseExpires int64  `json:"lease_expires_ns"`
}

// Slot states the driver keeps (qrtd's own, "held", and its conclusions).
const (
	SlotHeld      = qrtproto.StateHeld
	SlotCommitted = qrtproto.StateCommitted
	SlotGone      = "gone"
)

// held: qrtd holds the slot for the claim (a checkpoint written before
// the state was kept says "").
func (s Slot) held() bool { return s.State == "" || s.State == SlotHeld }

// CheckpointVersion is the format of the claim checkpoints this driver
// writes (<plugin-dir>/claims/<uid>.json).  A checkpoint without a version
// was written before the format had one, in the layout of version 1, and
// is read as such; one of a later version (a newer driver's, before a
// downgrade) is refused when the driver starts, naming it.
const CheckpointVersion = 1

// Checkpoint is what the driver keeps of a claim on disk, so that after a
// restart it prepares the claim to the same reservation (the request as
// first resolved, retried with the same idempotency key), heartbeats it
// and can release it.
type Checkpoint struct {
	// The format (CheckpointVersion when written).
	Version   int       `json:"version"`
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// The idempotency key of this allocation's slots.reserve (one of its
	// own for every allocation of the claim; "" in a checkpoint of an
	// older driver: k8s-claim-<UID>), and the allocation it is for
	// (its allocationTimestamp).
	Key         string                 `json:"idempotency_key,omitempty"`
	AllocatedAt string                 `json:"allocated_at,omitempty"`
	Request     Request                `json:"request"`
	Slots       []Slot                 `json:"slots,omitempty"`
	Devices     []kubeletplugin.Device `json:"devices"`
	// A gang member's hold: the gang controller's round it is for.
	GangRound int `json:"gang_round,omitempty"`
	// Booked by the binding controller before the pod bound, and not yet
	// prepared: released by the controller when the claim goes first.
	Binding bool `json:"binding,omitempty"`
}

// Driver implements kubeletplugin.DRAPlugin over a qrtd client.
type Driver struct {
	cfg    Config
	client *qrtd.Client
	cdi    *cdiapi.Cache
	// Where the reservation is written into the claim's device status
	// (nil: not written), off the prepare's path, at most statusWriters at
	// once, until bg ends.
	kube     kubernetes.Interface
	bg       context.Context
	statusWr chan struct{}
	// NodePrepareResources calls in flight: the status writes wait for
	// none to be.
	preparing atomic.Int64

	mu     sync.Mutex
	claims map[types.UID]*Checkpoint
	// Locks per claim, so that one claim's prepare and unprepare never
	// interleave while other claims go on.
	claimLocks map[types.UID]*sync.Mutex
	// The claim sockets being served.
	proxies map[types.UID]*claimProxy
	// The PodGroup with a gang policy of each pod a claim was reserved for
	// ("" none), by pod UID (gang.go).
	gangs map[types.UID]string
	// The cluster's DeviceTaintRules (the binding controller's informer).
	taintRules resourcelisters.DeviceTaintRuleLister

	res resourcesState
}

// New opens the state directory (loading the checkpoints of claims
// prepared before a restart) and the CDI directory.
func New(cfg Config, client *qrtd.Client) (*Driver, error) {
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	if cfg.BindingCheck <= 0 {
		cfg.BindingCheck = DefaultBindingCheck
	}
	if cfg.PodStart <= 0 {
		cfg.PodStart = DefaultPodStart
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.HostStateDir == "" {
		cfg.HostStateDir = cfg.StateDir
	}
	cfg.Proxy = cfg.Proxy.withDefaults()
	if cfg.ContainerSocket == "" {
		cfg.ContainerSocket = "/run/qrtd/qrtd.sock"
	}
	if err := os.MkdirAll(cfg.CDIDir, 0o750); err != nil {
		return nil, fmt.Errorf("create %s: %w", cfg.CDIDir, err)
	}
	// The claim sockets (claims/<uid>/) are for the pods' bind mounts
	// alone: no host user may reach them by their path.
	if err := prepareClaimsDir(filepath.Join(cfg.StateDir, "claims")); err != nil {
		return nil, err
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cfg.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache %s: %w", cfg.CDIDir, err)
	}
	d := &Driver{cfg: cfg, client: client, cdi: cache, claims: map[types.UID]*Checkpoint{},
		claimLocks: map[types.UID]*sync.Mutex{}, proxies: map[types.UID]*claimProxy{}, gangs: map[types.UID]string{}, statusWr: make(chan struct{}, statusWriters)}
	entries, err := os.ReadDir(filepath.Join(cfg.StateDir, "claims"))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(cfg.StateDir, "claims", e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", path, err)
		}
		cp, err := readCheckpoint(path, data)
		if err != nil {
			return nil, err
		}
		d.claims[cp.UID] = cp
	}
	return d, nil
}

// Prepared is a copy of the claim's checkpoint, nil when it is not
// prepared.
func (d *Driver) Prepared(uid types.UID) *Checkpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cp, ok := d.claims[uid]; ok && len(cp.Slots) > 0 {
		c := *cp
		return &c
	}
	return nil
}

func (d *Driver) lockClaim(uid types.UID) func() {
	d.mu.Lock()
	l, ok := d.claimLocks[uid]
	if !ok {
		l = &sync.Mutex{}
		d.claimLocks[uid] = l
	}
	d.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (d *Driver) checkpointPath(uid types.UID) string {
	return filepath.Join(d.cfg.StateDir, "claims", string(uid)+".json")
}

// writeFileAtomically: temporary file, fsync, rename, fsync of the
// directory -- a crash leaves the old checkpoint or the new, never half.
func writeFileAtomically(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	df, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer df.Close()
	return df.Sync()
}

// readCheckpoint decodes a claim's checkpoint of this driver's format or
// an earlier one; a later format is refused, naming the file.
func readCheckpoint(path string, data []byte) (*Checkpoint, error) {
	var head struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("checkpoint %s is not a claim checkpoint: %w", path, err)
	}
	if head.Version < 0 || head.Version > CheckpointVersion {
		return nil, fmt.Errorf("checkpoint %s is of format %d; this driver reads formats up to %d: "+
			"it was written by a newer qrt-dra-driver, which must run again to unprepare the claim", path, head.Version, CheckpointVersion)
	}
	var cp Checkpoint
	if err := json.Unmarshal(data, &cp); err != nil || cp.UID == "" {
		return nil, fmt.Errorf("checkpoint %s is not a claim checkpoint (format %d): %v", path, head.Version, err)
	}
	cp.Version = CheckpointVersion // format 0 (none) is version 1's layout
	return &cp, nil
}

func (d *Driver) saveCheckpoint(cp *Checkpoint) error {
	cp.Version = CheckpointVersion
	data, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	if err := writeFileAtomically(d.checkpointPath(cp.UID), data); err != nil {
		return fmt.Errorf("checkpoint claim %s: %w", cp.UID, err)
	}
	d.mu.Lock()
	d.claims[cp.UID] = cp
	d.mu.Unlock()
	return nil
}

func (d *Driver) dropCheckpoint(uid types.UID) error {
	if err := os.Remove(d.checkpointPath(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	d.mu.Lock()
	delete(d.claims, uid)
	delete(d.claimLocks, uid)
	d.mu.Unlock()
	return nil
}

// statusWriters bounds the claim status writes in flight; a prepare's
// write waits up to statusQuietMax for no prepare to be in flight.
const (
	statusWriters   = 4
	statusQuietMax  = 2 * time.Second
	statusQuietPoll = 5 * time.Millisecond
)

// IdempotencyKey is the key of the claim's slots.reserve for this
// allocation: a retried prepare or reserve (after a driver or kubelet
// restart) is the same booking; the claim allocated again (a second pod,
// or the scheduler's retry) books anew under a new key.
func (cp *Checkpoint) IdempotencyKey() string {
	if cp.Key != "" {
		return cp.Key
	}
	return "k8s-claim-" + string(cp.UID)
}

// newIdempotencyKey is a new allocation's key: k8s-claim-<UID>-<64 random
// bits> (at most 63 bytes; qrtd takes 128).
func newIdempotencyKey(uid types.UID) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return "k8s-claim-" + string(uid) + "-" + hex.EncodeToString(b[:])
}

// allocatedAt names a claim's allocation (its allocationTimestamp).
func allocatedAt(claim *resourceapi.ResourceClaim) string {
	if a := claim.Status.Allocation; a != nil && a.AllocationTimestamp != nil {
		return a.AllocationTimestamp.UTC().Format(time.RFC3339Nano)
	}
	return ""
}

// CDIDeviceID is the CDI device of a claim.
func CDIDeviceID(uid types.UID) string { return CDIKind + "=" + string(uid) }

func cdiSpecName(uid types.UID) string {
	return cdiapi.GenerateTransientSpecName(CDIVendor, CDIClass, string(uid)) + ".json"
}

// PrepareResourceClaims reserves each claim's slot (concurrently; one
// claim failing fails only itself) and writes its CDI spec.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.preparing.Add(1)
	defer d.preparing.Add(-1)
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, claim := range claims {
		wg.Add(1)
		go func(claim *resourceapi.ResourceClaim) {
			defer wg.Done()
			devices, err := d.prepare(ctx, claim)
			mu.Lock()
			out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
			mu.Unlock()
		}(claim)
	}
	wg.Wait()
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	defer d.lockClaim(claim.UID)()
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim), "uid", claim.UID)
	d.mu.Lock()
	cp := d.claims[claim.UID]
	d.mu.Unlock()
	if cp != nil && len(cp.Slots) > 0 {
		// Prepared before (kubelet retry or restart), or reserved before
		// the pod bound (binding conditions): the same devices.
		if cp.Binding {
			if end := lastEnd(cp.Slots); end <= d.cfg.Now().UnixNano() {
				return nil, fmt.Errorf("claim %s/%s: its slot ended at %s, before the pod started (prepared at %s): "+
					"give SlotParameters.notBefore the time the pod needs to start (image pull), or an absolute time",
					cp.Namespace, cp.Name, time.Unix(0, end).UTC().Format(time.RFC3339Nano), d.cfg.Now().UTC().Format(time.RFC3339Nano))
			}
			c := *cp
			c.Binding = false
			if err := d.saveCheckpoint(&c); err != nil {
				return nil, err
			}
			cp = &c
		}
		if err := d.serveClaim(cp); err != nil {
			return nil, err
		}
		if err := d.writeCDISpec(cp); err != nil {
			return nil, err
		}
		return cp.Devices, nil
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	qpus, devices, err := d.devicesOf(ctx, claim)
	if err != nil {
		return nil, err
	}
	if cp == nil {
		params, err := parametersOf(claim)
		if err != nil {
			return nil, err
		}
		req, err := Resolve(params, qpus, d.cfg.Now())
		if err != nil {
			return nil, err
		}
		// Write-ahead: the resolved request is on disk before qrtd books
		// it, so that a retry after a crash asks for exactly the same.
		cp = &Checkpoint{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name,
			Key: newIdempotencyKey(claim.UID), AllocatedAt: allocatedAt(claim), Request: req, Devices: devices}
		if err := d.saveCheckpoint(cp); err != nil {
			return nil, err
		}
	}
	slots, err := d.reserve(ctx, cp)
	if err != nil {
		return nil, err
	}
	next := *cp
	next.Slots = slots
	next.Binding = false
	next.Devices = devices // from the allocation, whatever a crash left
	if err := d.serveClaim(&next); err != nil {
		return nil, err
	}
	if err := d.writeCDISpec(&next); err != nil {
		return nil, err
	}
	if err := d.saveCheckpoint(&next); err != nil {
		return nil, err
	}
	logger.V(2).Info("Prepared", "reservations", next.Slots)
	if d.kube != nil && d.bg != nil {
		// The kubelet needs none of it: written after the answer, once
		// no prepare is in flight (at most statusQuietMax later), so
		// that a burst of pods' prepares does not share the node's CPU
		// with API writes nobody waits for.
		go func(claim *resourceapi.ResourceClaim, cp Checkpoint) {
			for i := 0; i < int(statusQuietMax/statusQuietPoll) && d.preparing.Load() > 0; i++ {
				select {
				case <-time.After(statusQuietPoll):
				case <-d.bg.Done():
					return
				}
			}
			select {
			case d.statusWr <- struct{}{}:
			case <-d.bg.Done():
				return
			}
			defer func() { <-d.statusWr }()
			if err := d.recordStatus(klog.NewContext(d.bg, logger), claim, &cp, nil); err != nil {
				logger.Info("Could not write the reservation into the claim's status", "err", err)
			}
		}(claim, next)
	}
	return next.Devices, nil
}

// SlotStatus is what the claim's status.devices[].data says of the slot
// (kubectl get resourceclaim -o yaml), when the API server keeps device
// status (DRAResourceClaimDeviceStatus).
type SlotStatus struct {
	ReservationID uint64 `json:"reservationID"`
	QPU           string `json:"qpu"`
	StartNS       int64  `json:"startNs"`
	EndNS         int64  `json:"endNs"`
	Start         string `json:"start"`
	Tenant        string `json:"tenant"`
	// A gang member's report to the gang controller (gang.go): the round
	// it answers, and, refused, the next start its QPU could give.
	GangRound   int   `json:"gangRound,omitempty"`
	NextStartNS int64 `json:"nextStartNs,omitempty"`
}

// recordStatus writes each slot (cp nil: none) into the claim's device
// status, and sets conds on each of the driver's devices (the conditions
// already there are kept).  The prepare logs a failure rather than fail:
// the slot is held and the pod can run.
func (d *Driver) recordStatus(ctx context.Context, claim *resourceapi.ResourceClaim, cp *Checkpoint, conds []metav1.Condition) error {
	return d.recordStatusWith(ctx, claim, cp, conds, nil)
}

// recordStatusWith is recordStatus with a gang member's report (gang
// non-nil: written into every device's data, with the slot if cp has one).
func (d *Driver) recordStatusWith(ctx context.Context, claim *resourceapi.ResourceClaim, cp *Checkpoint, conds []metav1.Condition, gang *SlotStatus) error {
	if d.kube == nil {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := d.kube.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != claim.UID || cur.Status.Allocation == nil {
			return nil
		}
		var keep []resourceapi.AllocatedDeviceStatus
		old := map[string]resourceapi.AllocatedDeviceStatus{}
		for _, st := range cur.Status.Devices {
			if st.Driver != DriverName {
				keep = append(keep, st)
			} else {
				old[st.Pool+"/"+st.Device] = st
			}
		}
		i := 0
		for _, r := range cur.Status.Allocation.Devices.Results {
			if r.Driver != DriverName {
				continue
			}
			st := resourceapi.AllocatedDeviceStatus{Driver: DriverName, Pool: r.Pool, Device: r.Device}
			if prev, ok := old[r.Pool+"/"+r.Device]; ok {
				st.Conditions, st.Data = prev.Conditions, prev.Data
			}
			var ss *SlotStatus
			if gang != nil {
				g := *gang
				ss = &g
			}
			if cp != nil && i < len(cp.Slots) {
				s := cp.Slots[i]
				if ss == nil {
					ss = &SlotStatus{}
				}
				ss.ReservationID, ss.QPU, ss.StartNS, ss.EndNS, ss.Tenant = s.ReservationID, s.QPU, s.StartNS, s.EndNS, s.Tenant
				ss.Start = time.Unix(0, s.StartNS).UTC().Format(time.RFC3339Nano)
			}
			if ss != nil {
				data, _ := json.Marshal(ss)
				st.Data = &runtime.RawExtension{Raw: data}
			}
			i++
			for _, c := range conds {
				meta.SetStatusCondition(&st.Conditions, c)
			}
			if r.ShareID != nil {
				id := string(*r.ShareID)
				st.ShareID = &id
			}
			keep = append(keep, st)
		}
		cur.Status.Devices = keep
		_, err = d.kube.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

type reserveParams struct {
	Request
	IdempotencyKey string `json:"idempotency_key"`
	LeaseNS        int64  `json:"lease_ns"`
	OnBehalfOf     string `json:"on_behalf_of"`
}

func (d *Driver) reserve(ctx context.Context, cp *Checkpoint) ([]Slot, error) {
	p := reserveParams{Request: cp.Request, IdempotencyKey: cp.IdempotencyKey(),
		LeaseNS: d.cfg.Lease.Nanoseconds(), OnBehalfOf: cp.Namespace}
	if cp.Request.GangSize > 1 {
		var g struct {
			Gang []Slot `json:"gang"`
		}
		if err := d.client.Call(ctx, qrtproto.MethodSlotsReserve, p, &g); err != nil {
			return nil, d.explain(ctx, cp, err)
		}
		return g.Gang, nil
	}
	var s Slot
	if err := d.client.Call(ctx, qrtproto.MethodSlotsReserve, p, &s); err != nil {
		return nil, d.explain(ctx, cp, err)
	}
	return []Slot{s}, nil
}

// explain adds to a refused reserve what a user needs: qrtd's reason and,
// for no_fit, the next window qrtd knows of (slots.query).
func (d *Driver) explain(ctx context.Context, cp *Checkpoint, err error) error {
	reason := qrtd.ReasonOf(err)
	if reason == "" {
		return fmt.Errorf("claim %s/%s: slots.reserve: %w", cp.Namespace, cp.Name, err)
	}
	msg := fmt.Sprintf("claim %s/%s: qrtd refused the slot: %s: %v", cp.Namespace, cp.Name, reason, err.(*qrtd.Error).Message)
	var next int64
	if reason == qrtproto.ReasonNoFit {
		// Where it would fit without its deadline: the next possible
		// start; or, when nothing fits at all, the next window.
		var q struct {
			Candidates []struct {
				QPU     string `json:"qpu"`
				StartNS int64  `json:"start_ns"`
			} `json:"candidates"`
			Next *struct {
				QPU         string `json:"qpu"`
				ValidFromNS int64  `json:"valid_from_ns"`
			} `json:"next_window"`
		}
		qp := map[string]any{"duration_ns": cp.Request.DurationNS, "qpus": cp.Request.QPUs,
			"on_behalf_of": cp.Namespace, "max_candidates": 1}
		if cp.Request.NotBeforeNS > 0 {
			qp["not_before_ns"] = cp.Request.NotBeforeNS
		}
		if cp.Request.MinFidelity > 0 {
			qp["min_fidelity"] = cp.Request.MinFidelity
		}
		if cp.Request.GangSize > 1 {
			qp["gang_size"] = cp.Request.GangSize
		}
		if qerr := d.client.Call(ctx, qrtproto.MethodSlotsQuery, qp, &q); qerr == nil {
			switch {
			case len(q.Candidates) > 0:
				next = q.Candidates[0].StartNS
				msg += fmt.Sprintf("; next possible start: %s (qpu %s, without the deadline)",
					time.Unix(0, q.Candidates[0].StartNS).UTC().Format(time.RFC3339Nano), q.Candidates[0].QPU)
			case q.Next != nil:
				msg += fmt.Sprintf("; next calibration window: %s (qpu %s)",
					time.Unix(0, q.Next.ValidFromNS).UTC().Format(time.RFC3339Nano), q.Next.QPU)
			}
		}
	}
	return &RefusedError{Reason: reason, Message: msg, NextStartNS: next, Err: err}
}

// RefusedError is a slot qrtd refused, with its reason (and for no_fit
// the next possible start without the deadline, 0 when none is known).
type RefusedError struct {
	Reason      string
	Message     string
	NextStartNS int64
	Err         error
}

func (e *RefusedError) Error() string { return e.Message }
func (e *RefusedError) Unwrap() error { return e.Err }

func (d *Driver) writeCDISpec(cp *Checkpoint) error {
	ids := make([]string, 0, len(cp.Slots))
	qpus := make([]string, 0, len(cp.Slots))
	for _, s := range cp.Slots {
		ids = append(ids, strconv.FormatUint(s.ReservationID, 10))
		qpus = append(qpus, s.QPU)
	}
	first := cp.Slots[0]
	spec := &cdispec.Spec{
		Version: cdispec.CurrentVersion,
		Kind:    CDIKind,
		Devices: []cdispec.Device{{
			Name: string(cp.UID),
			ContainerEdits: cdispec.ContainerEdits{
				Env: []string{
					"QRT_SOCKET=" + d.cfg.ContainerSocket,
					"QRT_RESERVATION_ID=" + strings.Join(ids, ","),
					"QRT_QPUS=" + strings.Join(qpus, ","),
					"QRT_SLOT_START_NS=" + strconv.FormatInt(first.StartNS, 10),
					"QRT_SLOT_END_NS=" + strconv.FormatInt(first.EndNS, 10),
					"QRT_FENCING_TOKEN=" + strconv.FormatUint(first.FencingToken, 10),
					"QRT_TENANT=" + first.Tenant,
					"QRT_IDEMPOTENCY_KEY=" + cp.IdempotencyKey(),
				},
				// The claim's directory, not its socket: a restarted
				// driver's new socket is seen by a running container.
				Mounts: []*cdispec.Mount{{
					HostPath:      filepath.Join(d.cfg.HostStateDir, "claims", string(cp.UID)),
					ContainerPath: filepath.Dir(d.cfg.ContainerSocket),
					// Read-only: the pod connects to the socket (connect
					// needs no write access to the file system) and can
					// neither fill the node's disk nor plant anything in
					// the directory the driver serves it from.
					Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
				}},
			},
		}},
	}
	if v, err := cdiapi.MinimumRequiredVersion(spec); err == nil {
		spec.Version = v
	}
	// WriteSpec validates the spec with the CDI project's own checks
	// (kind, device names, edits) before it writes it.
	if err := d.cdi.WriteSpec(spec, cdiSpecName(cp.UID)); err != nil {
		return fmt.Errorf("claim %s/%s: CDI spec: %w", cp.Namespace, cp.Name, err)
	}
	return nil
}

// UnprepareResourceClaims releases each claim's reservations and removes
// its CDI spec and checkpoint.  An unknown claim succeeds.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range claims {
		wg.Add(1)
		go func(uid types.UID) {
			defer wg.Done()
			err := d.unprepare(ctx, uid)
			mu.Lock()
			out[uid] = err
			mu.Unlock()
		}(c.UID)
	}
	wg.Wait()
	return out, nil
}

// finalRelease: qrtd answered, and the slot is not held by this claim any
// more (released, expired, displaced, committed to a job, or unknown):
// nothing is left to give back.
func finalRelease(err error) bool {
	switch qrtd.ReasonOf(err) {
	case "", qrtproto.ReasonUnavailable, qrtproto.ReasonInternalError, qrtproto.ReasonQuotaExceeded:
		return false
	}
	return true
}

func (d *Driver) unprepare(ctx context.Context, uid types.UID) error {
	defer d.lockClaim(uid)()
	return d.unprepareLocked(ctx, uid)
}

func (d *Driver) unprepareLocked(ctx context.Context, uid types.UID) error {
	d.mu.Lock()
	cp := d.claims[uid]
	d.mu.Unlock()
	if cp == nil {
		return d.stopClaim(uid, true) // nothing of it may stay
	}
	// The pod is gone: its socket goes before its slot.
	if err := d.stopClaim(uid, true); err != nil {
		return fmt.Errorf("claim %s/%s: %w", cp.Namespace, cp.Name, err)
	}
	for _, s := range cp.Slots {
		if !s.held() {
			continue // committed to the pod's job, or gone: not ours to release
		}
		err := d.client.Call(ctx, qrtproto.MethodSlotsRelease, map[string]any{
			"reservation_id": s.ReservationID, "fencing_token": s.FencingToken,
			"on_behalf_of": cp.Namespace}, nil)
		if err != nil && !finalRelease(err) {
			return fmt.Errorf("claim %s/%s: release reservation %d: %w", cp.Namespace, cp.Name, s.ReservationID, err)
		}
	}
	if err := d.cdi.RemoveSpec(cdiSpecName(uid)); err != nil {
		return fmt.Errorf("claim %s/%s: remove CDI spec: %w", cp.Namespace, cp.Name, err)
	}
	return d.dropCheckpoint(uid)
}

// HandleError logs background errors (ResourceSlice publishing); all of
// them are retried by the controller.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// preparedClaims is every claim that holds a reservation, taken under d.mu.
func (d *Driver) preparedClaims() []*Checkpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	var cps []*Checkpoint
	for _, cp := range d.claims {
		if len(cp.Slots) > 0 {
			cps = append(cps, cp)
		}
	}
	return cps
}

// Heartbeat renews the lease of every slot a claim holds, once;
// HeartbeatLoop calls it every Lease/3.  A slot the pod's job committed
// into is not heartbeated (it has no lease any more), nor one qrtd says
// it no longer holds (expired, displaced, committed by another way): that
// is logged once and kept in the checkpoint; the pod learns it from
// jobs.submit.
func (d *Driver) Heartbeat(ctx context.Context) {
	cps := d.preparedClaims()
	sort.Slice(cps, func(i, j int) bool { return cps[i].UID < cps[j].UID })
	for _, cp := range cps {
		for _, s := range cp.Slots {
			if !s.held() {
				continue
			}
			err := d.client.Call(ctx, qrtproto.MethodSlotsHeartbeat, map[string]any{
				"reservation_id": s.ReservationID, "fencing_token": s.FencingToken,
				"on_behalf_of": cp.Namespace}, nil)
			if err == nil {
				continue
			}
			klog.FromContext(ctx).Info("Heartbeat failed", "claim", klog.KRef(cp.Namespace, cp.Name), "reservation", s.ReservationID, "err", err)
			if finalRelease(err) {
				state := SlotGone
				if qrtd.ReasonOf(err) == qrtproto.ReasonIllegalTransition {
					state = SlotCommitted // no longer held: a job is in it
				}
				d.setSlotState(cp.UID, s.ReservationID, state)
			}
		}
	}
}

// setSlotState records that a claim's slot is no longer held (committed
// or gone), in memory and in its checkpoint.
func (d *Driver) setSlotState(uid types.UID, id uint64, state string) {
	defer d.lockClaim(uid)()
	d.mu.Lock()
	cp := d.claims[uid]
	d.mu.Unlock()
	if cp == nil {
		return
	}
	next := *cp
	next.Slots = append([]Slot(nil), cp.Slots...)
	changed := false
	for i := range next.Slots {
		if next.Slots[i].ReservationID == id && next.Slots[i].State != state {
			next.Slots[i].State, changed = state, true
		}
	}
	if changed {
		if err := d.saveCheckpoint(&next); err != nil {
			klog.Background().Error(err, "Could not checkpoint a slot's state", "claim", klog.KRef(cp.Namespace, cp.Name))
		}
	}
}

// lastEnd is the end of the last of the slots.
func lastEnd(slots []Slot) int64 {
	var end int64
	for _, s := range slots {
		end = max(end, s.EndNS)
	}
	return end
}

// HeartbeatLoop heartbeats until ctx ends.
func (d *Driver) HeartbeatLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.Heartbeat(ctx)
		}
	}
}
