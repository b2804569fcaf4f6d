package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	qpuv1alpha1 "qrtd.io/tools/integrations/k8s/api/qpu.qrtd.io/v1alpha1"
)

// slotStart is a whole second at least lead ahead: its window of qpu0 is
// [start+100ms, start+1s).
func slotStart(lead time.Duration) time.Time {
	return time.Now().Add(lead).Truncate(time.Second).Add(time.Second)
}

func rfc(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// waitSlice waits for the node's ResourceSlice to hold devices matching ok.
func waitSlice(t *testing.T, kube kubernetes.Interface, what string, ok func(map[string]resourceapi.Device) bool) map[string]resourceapi.Device {
	t.Helper()
	var got map[string]resourceapi.Device
	waitFor(t, what, 20*time.Second, func() bool {
		list, err := kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		got = map[string]resourceapi.Device{}
		for _, s := range list.Items {
			if s.Spec.Driver != DriverName || s.Spec.Pool.Name != nodeName || s.Spec.NodeName == nil || *s.Spec.NodeName != nodeName {
				continue
			}
			for _, d := range s.Spec.Devices {
				got[d.Name] = d
			}
		}
		return ok(got)
	})
	return got
}

func intOf(d resourceapi.Device, name string) int64 {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.IntValue != nil {
		return *a.IntValue
	}
	return -1
}

// slotOf reads a prepared claim's slot the way a container gets it: the
// CDI spec in the CDI directory, read and applied to an OCI spec by the
// CDI project's own code (as containerd and CRI-O do).
type slotEnv struct {
	ReservationID uint64
	Start, End    int64
	Token         uint64
	QPUs          string
	Env           map[string]string
	Mount         *oci.Mount
}

func slotOf(t *testing.T, cdiDir, id string) slotEnv {
	t.Helper()
	s, err := cdiSlot(cdiDir, id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cdiSlot is slotOf for any goroutine: the error instead of a failed test.
func cdiSlot(cdiDir string, ids ...string) (slotEnv, error) {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return slotEnv{}, fmt.Errorf("CDI cache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		return slotEnv{}, fmt.Errorf("CDI specs in %s do not validate: %v", cdiDir, errs)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		return slotEnv{}, fmt.Errorf("CDI InjectDevices(%v): %v (unresolved %v)", ids, err, unresolved)
	}
	s := slotEnv{Env: map[string]string{}}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		s.Env[k] = v
	}
	s.ReservationID, _ = strconv.ParseUint(s.Env["QRT_RESERVATION_ID"], 10, 64)
	s.Start, _ = strconv.ParseInt(s.Env["QRT_SLOT_START_NS"], 10, 64)
	s.End, _ = strconv.ParseInt(s.Env["QRT_SLOT_END_NS"], 10, 64)
	s.Token, _ = strconv.ParseUint(s.Env["QRT_FENCING_TOKEN"], 10, 64)
	s.QPUs = s.Env["QRT_QPUS"]
	for i := range spec.Mounts {
		if spec.Mounts[i].Destination == "/run/qrtd" {
			s.Mount = &spec.Mounts[i]
		}
	}
	return s, nil
}

type status struct {
	State          string `json:"state"`
	Tenant         string `json:"tenant"`
	QPU            string `json:"qpu"`
	StartNS        int64  `json:"start_ns"`
	EndNS          int64  `json:"end_ns"`
	LeaseExpiresNS int64  `json:"lease_expires_ns"`
}

func (l *lab) status(ns string, id uint64) status {
	l.t.Helper()
	var st status
	if err := l.call("jobs.status", map[string]any{"job_id": id, "on_behalf_of": ns}, &st); err != nil {
		l.t.Fatalf("jobs.status %d of %s: %v", id, ns, err)
	}
	return st
}

func requireOK(t *testing.T, what string, resp map[string]*drav1.NodePrepareResourceResponse, c *resourceapi.ResourceClaim) *drav1.NodePrepareResourceResponse {
	t.Helper()
	r := resp[string(c.UID)]
	if r == nil {
		t.Fatalf("%s: no answer for claim %s", what, c.Name)
	}
	if r.Error != "" {
		t.Fatalf("%s: claim %s failed: %s", what, c.Name, r.Error)
	}
	if len(r.Devices) == 0 || len(r.Devices[0].CdiDeviceIds) != 1 {
		t.Fatalf("%s: claim %s: devices %v", what, c.Name, r.Devices)
	}
	return r
}

func TestKubeletRegistersPreparesAndUnpreparesAgainstARealQrtd(t *testing.T) {
	l := newLab(t, periodic)
	kube, api := newHTTPAPI(t)
	rc := l.startDriver("d", kube)

	// A refused registration is answered with the kubelet's message.
	if _, err := register(t, rc, false); err == nil || !strings.Contains(err.Error(), "refused on purpose") {
		t.Fatalf("NotifyRegistrationStatus(false): err %v, want the kubelet's message back", err)
	}
	k := newKubelet(t, rc)

	// Advertise: one device per QPU, with qrtd's facts.
	devs := waitSlice(t, kube, "the ResourceSlice with qpu0", func(d map[string]resourceapi.Device) bool {
		return len(d) == 1 && intOf(d["qpu0"], "windowPeriodNs") == periodNS
	})
	q0 := devs["qpu0"]
	if got := intOf(q0, "predictedFidelityPpm"); got != 990000 {
		t.Errorf("qpu0 predictedFidelityPpm %d, want 990000", got)
	}
	if intOf(q0, "minLeadNs") <= 0 || q0.Attributes["qpu"].StringValue == nil || *q0.Attributes["qpu"].StringValue != "qpu0" {
		t.Errorf("qpu0 attributes %v", q0.Attributes)
	}
	// qrtd.toml's [qpu.device] facts, through qpus.list.
	if intOf(q0, "qubits") != 5 || intOf(q0, "maxShots") != 100000 || q0.Attributes["technology"].StringValue == nil ||
		*q0.Attributes["technology"].StringValue != "superconducting" {
		t.Errorf("qpu0's device facts: %v", q0.Attributes)
	}
	if q0.AllowMultipleAllocations == nil || !*q0.AllowMultipleAllocations {
		t.Errorf("qpu0 is not shared in time (allowMultipleAllocations)")
	}

	// Two pods' claims, in two namespaces, for the same window.
	T := slotStart(8 * time.Second)
	params := slotParams(fmt.Sprintf(`"duration":"50ms","notBefore":%q,"deadline":%q,"minFidelity":0.9`,
		rfc(T), rfc(T.Add(time.Second))))
	a := newClaim("team-a", "claim-a", params, "qpu0")
	b := newClaim("team-b", "claim-b", params, "qpu0")
	createClaims(t, kube, a, b)
	resp := k.prepare(a, b)
	ra, rb := requireOK(t, "prepare", resp, a), requireOK(t, "prepare", resp, b)
	sa := slotOf(t, rc.CDIDir, ra.Devices[0].CdiDeviceIds[0])
	sb := slotOf(t, rc.CDIDir, rb.Devices[0].CdiDeviceIds[0])
	for name, s := range map[string]slotEnv{"a": sa, "b": sb} {
		if s.ReservationID == 0 || s.Token == 0 || s.QPUs != "qpu0" || s.Env["QRT_SOCKET"] != "/run/qrtd/qrtd.sock" {
			t.Fatalf("claim %s: container env %v", name, s.Env)
		}
		uid := map[string]types.UID{"a": a.UID, "b": b.UID}[name]
		if s.Mount == nil || s.Mount.Source != rc.PluginDir+"/claims/"+string(uid) {
			t.Fatalf("claim %s: no bind mount of the claim's socket directory: %+v", name, s.Mount)
		}
		// Inside the calibration window after T's blackout.
		if s.Start < T.UnixNano()+blackoutNS || s.End > T.UnixNano()+periodNS || s.End-s.Start != 50*ms {
			t.Errorf("claim %s: slot [%d, %d) outside the window [%d, %d)", name, s.Start, s.End,
				T.UnixNano()+blackoutNS, T.UnixNano()+periodNS)
		}
	}
	// Never overlapping.
	if sa.Start < sb.End && sb.Start < sa.End {
		t.Errorf("slots overlap: a [%d, %d), b [%d, %d)", sa.Start, sa.End, sb.Start, sb.End)
	}
	// Booked for the namespace (its quotas), held under a lease.
	user := strings.SplitN(l.status("team-a", sa.ReservationID).Tenant, "/", 2)[0]
	for ns, s := range map[string]slotEnv{"team-a": sa, "team-b": sb} {
		st := l.status(ns, s.ReservationID)
		if st.State != "held" || st.Tenant != user+"/"+ns || st.StartNS != s.Start {
			t.Errorf("%s: qrtd holds %+v", ns, st)
		}
	}

	// The reservation is in the claim's device status.
	waitFor(t, "claim a's device status", 10*time.Second, func() bool {
		got, err := kube.ResourceV1().ResourceClaims("team-a").Get(context.Background(), a.Name, metav1.GetOptions{})
		return err == nil && len(got.Status.Devices) == 1 && got.Status.Devices[0].Data != nil &&
			strings.Contains(string(got.Status.Devices[0].Data.Raw), fmt.Sprintf(`"reservationID":%d`, sa.ReservationID))
	})

	// Repeated prepare (kubelet retry), over v1 and v1beta1: the same.
	again := requireOK(t, "prepare again", k.prepare(a), a)
	if again.Devices[0].CdiDeviceIds[0] != ra.Devices[0].CdiDeviceIds[0] ||
		slotOf(t, rc.CDIDir, again.Devices[0].CdiDeviceIds[0]).ReservationID != sa.ReservationID {
		t.Errorf("a repeated prepare changed the claim's slot")
	}
	ctx, cancel := context.WithTimeout(context.Background(), pluginClientTimeout)
	defer cancel()
	beta, err := k.v1b.NodePrepareResources(ctx, &drav1beta1.NodePrepareResourcesRequest{
		Claims: []*drav1beta1.Claim{{Namespace: a.Namespace, Name: a.Name, Uid: string(a.UID)}}})
	if err != nil || beta.Claims[string(a.UID)].Error != "" ||
		beta.Claims[string(a.UID)].Devices[0].CdiDeviceIds[0] != ra.Devices[0].CdiDeviceIds[0] {
		t.Errorf("v1beta1 NodePrepareResources: %v %v", err, beta)
	}

	// The lease is heartbeated while prepared.
	before := l.status("team-b", sb.ReservationID).LeaseExpiresNS
	waitFor(t, "a heartbeat", 5*time.Second, func() bool {
		return l.status("team-b", sb.ReservationID).LeaseExpiresNS > before
	})

	// Unprepare releases; again, and for an unknown claim, it succeeds.
	unknown := newClaim("team-a", "never-prepared", params, "qpu0")
	for i := 0; i < 2; i++ {
		for uid, r := range k.unprepare(a, unknown) {
			if r.Error != "" {
				t.Fatalf("unprepare %s (round %d): %s", uid, i, r.Error)
			}
		}
	}
	if st := l.status("team-a", sa.ReservationID); st.State != "released" {
		t.Errorf("after unprepare a's reservation is %s", st.State)
	}
	if _, err := os.Stat(rc.CDIDir + "/" + cdiSpecName(a.UID)); !os.IsNotExist(err) {
		t.Errorf("a's CDI spec is still there: %v", err)
	}
	// The slot it freed is the next claim's.
	c := newClaim("team-a", "claim-c", params, "qpu0")
	createClaims(t, kube, c)
	rcC := requireOK(t, "prepare c", k.prepare(c), c)
	if sc := slotOf(t, rc.CDIDir, rcC.Devices[0].CdiDeviceIds[0]); sc.Start != sa.Start {
		t.Errorf("claim c got [%d, %d), not the slot a freed at %d", sc.Start, sc.End, sa.Start)
	}
	k.unprepare(b, c)
	requireOverHTTP(t, api)
}

func TestRefusedClaimsNameTheFieldOrQrtdsReasonAndTheNextStart(t *testing.T) {
	l := newLab(t, periodic)
	kube := newFakeAPI()
	rc := l.startDriver("d", kube)
	k := newKubelet(t, rc)
	waitSlice(t, kube, "the ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })

	T := slotStart(8 * time.Second)
	// Inside the blackout [T, T+100ms): qrtd cannot fit it.
	impossible := newClaim("team-a", "too-tight", slotParams(fmt.Sprintf(`"duration":"50ms","notBefore":%q,"deadline":%q`,
		rfc(T), rfc(T.Add(90*time.Millisecond)))), "qpu0")
	cases := map[string]*resourceapi.ResourceClaim{
		"no_fit": newClaim("team-a", "x", "{}", "qpu0"), // replaced below
		"SlotParameters: duration: Invalid value":    newClaim("team-a", "bad-duration", slotParams(`"duration":"fast"`), "qpu0"),
		"SlotParameters: durration: Forbidden":       newClaim("team-a", "typo", slotParams(`"durration":"2ms"`), "qpu0"),
		"SlotParameters: minFidelity: Invalid value": newClaim("team-a", "fid", slotParams(`"duration":"2ms","minFidelity":1.5`), "qpu0"),
		"SlotParameters: count: Invalid value":       newClaim("team-a", "gang", slotParams(`"duration":"2ms","count":2`), "qpu0"),
		"SlotParameters: kind: Unsupported value":    newClaim("team-a", "kind", `{"apiVersion":"qpu.qrtd.io/v1alpha1","kind":"Slot","duration":"2ms"}`, "qpu0"),
		"SlotParameters: deadline: Invalid value":    newClaim("team-a", "dl", slotParams(`"duration":"2s","deadline":"1s"`), "qpu0"),
	}
	cases["no_fit"] = impossible
	var all []*resourceapi.ResourceClaim
	for _, c := range cases {
		all = append(all, c)
	}
	createClaims(t, kube, all...)
	resp := k.prepare(all...)
	for want, c := range cases {
		r := resp[string(c.UID)]
		if r == nil || r.Error == "" || !strings.Contains(r.Error, want) {
			t.Errorf("claim %s: error %q, want one naming %s", c.Name, r.GetError(), want)
		}
	}
	msg := resp[string(impossible.UID)].Error
	next := rfc(T.Add(time.Duration(blackoutNS)))
	if !strings.Contains(msg, "next possible start: "+next) {
		t.Errorf("no_fit error %q does not give the next start %s", msg, next)
	}
	t.Logf("refused as: %s", msg)
	// Nothing was booked for them.
	var q struct {
		Candidates []map[string]any `json:"candidates"`
	}
	if err := l.call("slots.query", map[string]any{"duration_ns": 100 * ms, "not_before_ns": T.UnixNano() + blackoutNS,
		"deadline_ns": T.UnixNano() + blackoutNS + 100*ms, "qpus": []string{"qpu0"}}, &q); err != nil || len(q.Candidates) == 0 {
		t.Errorf("the window after T is not free: %v %v", err, q)
	}
}

func TestAGangOnOneNodeIsReservedTogether(t *testing.T) {
	l := newLab(t, periodicPushed)
	kube := newFakeAPI()
	rc := l.startDriver("d", kube)
	k := newKubelet(t, rc)
	waitSlice(t, kube, "the ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })
	// qpu1 is pushed: give it the same window as qpu0's next one.
	T := slotStart(8 * time.Second)
	if err := l.call("calibration.update", map[string]any{"qpu": "qpu1", "windows": []map[string]any{{
		"calibration_id": 7, "valid_from_ns": T.UnixNano() + blackoutNS, "valid_until_ns": T.UnixNano() + periodNS,
		"f0": 0.97}}}, nil); err != nil {
		t.Fatal(err)
	}
	g := newClaim("team-g", "gang", slotParams(fmt.Sprintf(`"duration":"20ms","notBefore":%q,"count":2`, rfc(T))), "qpu0", "qpu1")
	createClaims(t, kube, g)
	r := requireOK(t, "prepare gang", k.prepare(g), g)
	if len(r.Devices) != 2 {
		t.Fatalf("gang devices %v", r.Devices)
	}
	s := slotOf(t, rc.CDIDir, r.Devices[0].CdiDeviceIds[0])
	ids := strings.Split(s.Env["QRT_RESERVATION_ID"], ",")
	if len(ids) != 2 || s.QPUs != "qpu0,qpu1" && s.QPUs != "qpu1,qpu0" {
		t.Fatalf("gang env %v", s.Env)
	}
	var starts []int64
	for _, id := range ids {
		n, _ := strconv.ParseUint(id, 10, 64)
		starts = append(starts, l.status("team-g", n).StartNS)
	}
	if starts[0] != starts[1] {
		t.Errorf("gang members start at %v, not together", starts)
	}
	k.unprepare(g)
}

func TestKubeletRestartRegistersAgainAndTheSliceIsRepublished(t *testing.T) {
	l := newLab(t, periodic)
	kube, api := newHTTPAPI(t)
	rc := l.startDriver("d", kube)
	newKubelet(t, rc)
	waitSlice(t, kube, "the ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })

	// The kubelet restarts: it deletes the node's slices and, with a clean
	// plugin registry, the registration socket.
	ctx := context.Background()
	list, _ := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	for _, s := range list.Items {
		if err := kube.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(rc.RegistrationSocket()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new registration socket", 10*time.Second, func() bool {
		_, err := os.Stat(rc.RegistrationSocket())
		return err == nil
	})
	k := newKubelet(t, rc) // dial again, GetInfo, NotifyRegistrationStatus(true)
	waitSlice(t, kube, "the republished ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })
	T := slotStart(8 * time.Second)
	c := newClaim("team-a", "after-restart", slotParams(fmt.Sprintf(`"duration":"5ms","notBefore":%q`, rfc(T))), "qpu0")
	createClaims(t, kube, c)
	requireOK(t, "prepare after the restart", k.prepare(c), c)
	k.unprepare(c)
	requireOverHTTP(t, api)
}

func TestASIGKILLedDriverPreparesTheSameClaimToTheSameReservation(t *testing.T) {
	l := newLab(t, periodic)
	params := slotParams(`"duration":"10ms","notBefore":"2s","deadline":"60s"`)
	x := newClaim("team-a", "x", params, "qpu0")
	y := newClaim("team-a", "y", params, "qpu0")
	child, rc := l.startChild("c", x, y)
	k := newKubelet(t, rc)
	first := slotOf(t, rc.CDIDir, requireOK(t, "prepare x", k.prepare(x), x).Devices[0].CdiDeviceIds[0])

	// Killed mid-flight: y's request is checkpointed and its reserve
	// reached qrtd, but the driver died before it answered the kubelet.
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	req, err := Resolve(slotParamsOf(t, y), []string{"qpu0"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cp := &Checkpoint{UID: y.UID, Namespace: y.Namespace, Name: y.Name, Key: newIdempotencyKey(y.UID), Request: req}
	d, err := New(Config{NodeName: nodeName, CDIDir: rc.CDIDir, StateDir: rc.StateDir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.saveCheckpoint(cp); err != nil {
		t.Fatal(err)
	}
	var booked Slot
	if err := l.call("slots.reserve", reserveParams{Request: req, IdempotencyKey: cp.IdempotencyKey(),
		LeaseNS: int64(30 * time.Second), OnBehalfOf: y.Namespace}, &booked); err != nil {
		t.Fatal(err)
	}

	_, rc2 := l.startChild("c", x, y) // the same directories
	k2 := newKubelet(t, rc2)
	resp := k2.prepare(x, y)
	again := slotOf(t, rc.CDIDir, requireOK(t, "prepare x after SIGKILL", resp, x).Devices[0].CdiDeviceIds[0])
	if again.ReservationID != first.ReservationID || again.Start != first.Start {
		t.Errorf("after SIGKILL x got reservation %d at %d, before %d at %d", again.ReservationID, again.Start,
			first.ReservationID, first.Start)
	}
	sy := slotOf(t, rc.CDIDir, requireOK(t, "prepare y after SIGKILL", resp, y).Devices[0].CdiDeviceIds[0])
	if sy.ReservationID != booked.ReservationID {
		t.Errorf("y got reservation %d, not %d that the killed driver had booked", sy.ReservationID, booked.ReservationID)
	}
	for _, id := range []uint64{first.ReservationID, booked.ReservationID} {
		if st := l.status("team-a", id); st.State != "held" {
			t.Errorf("reservation %d is %s", id, st.State)
		}
	}
	// The restarted driver serves the pods' claim sockets again (a pod's
	// bind mount of the claim's directory sees the new socket).
	for _, c := range []struct {
		claim *resourceapi.ResourceClaim
		id    uint64
	}{{x, first.ReservationID}, {y, booked.ReservationID}} {
		var st status
		claimCall(t, filepath.Join(rc2.PluginDir, "claims", string(c.claim.UID), "qrtd.sock"), "jobs.status",
			map[string]any{"job_id": c.id}, &st)
		if st.State != "held" || !strings.HasSuffix(st.Tenant, "/team-a") {
			t.Errorf("claim %s's socket after the restart: %+v", c.claim.Name, st)
		}
	}
	for uid, r := range k2.unprepare(x, y) {
		if r.Error != "" {
			t.Errorf("unprepare %s: %s", uid, r.Error)
		}
	}
	if st := l.status("team-a", first.ReservationID); st.State != "released" {
		t.Errorf("x's reservation after unprepare: %s", st.State)
	}
}

func slotParamsOf(t *testing.T, c *resourceapi.ResourceClaim) *qpuv1alpha1.SlotParameters {
	t.Helper()
	p, err := parametersOf(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestACalibrationUpdateIsRepublished(t *testing.T) {
	l := newLab(t, pushed)
	kube, api := newHTTPAPI(t)
	rc := l.startDriver("d", kube)
	newKubelet(t, rc)
	waitSlice(t, kube, "the ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })
	var lat []time.Duration
	for i := int64(1); i <= 5; i++ {
		id := 100 + i
		now := time.Now().UnixNano()
		start := time.Now()
		if err := l.call("calibration.update", map[string]any{"qpu": "qpu0", "windows": []map[string]any{{
			"calibration_id": id, "valid_from_ns": now + int64(time.Second), "valid_until_ns": now + int64(time.Minute),
			"f0": 0.95}}}, nil); err != nil {
			t.Fatal(err)
		}
		waitSlice(t, kube, fmt.Sprintf("qpu0 at calibration %d", id), func(d map[string]resourceapi.Device) bool {
			return intOf(d["qpu0"], "windowCalibrationId") == id
		})
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("calibration.update -> republished ResourceSlice: median %s, max %s (5 updates)", lat[2], lat[4])
	requireOverHTTP(t, api)
}

// ---------------------------------------------------------- benchmark

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(p*float64(len(d))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(d) {
		i = len(d) - 1
	}
	return d[i]
}

// TestBenchNodePrepareResources measures NodePrepareResources (the
// kubelet's gRPC call, through the helper, the fake API read, qrtd's
// slots.reserve, the checkpoint fsyncs and the CDI spec): one claim at a
// time, and 32 pods' calls at once.  Run by bench/k8s/run.sh
// (QRT_K8S_BENCH=1).
func TestBenchNodePrepareResources(t *testing.T) {
	if os.Getenv("QRT_K8S_BENCH") == "" {
		t.Skip("a benchmark: QRT_K8S_BENCH=1 (bench/k8s/run.sh)")
	}
	l := newLab(t, periodic)
	kube := newFakeAPI()
	rc := l.startDriver("d", kube)
	k := newKubelet(t, rc)
	waitSlice(t, kube, "the ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })
	T := slotStart(8 * time.Second)
	params := slotParams(fmt.Sprintf(`"duration":"1ms","notBefore":%q,"deadline":%q`, rfc(T), rfc(T.Add(30*time.Second))))
	n := 0
	claim := func() *resourceapi.ResourceClaim {
		n++
		c := newClaim(fmt.Sprintf("ns-%d", n%8), fmt.Sprintf("c-%d", n), params, "qpu0")
		createClaims(t, kube, c)
		return c
	}
	var one []time.Duration
	for i := 0; i < 100; i++ {
		c := claim()
		start := time.Now()
		requireOK(t, "prepare", k.prepare(c), c)
		one = append(one, time.Since(start))
		k.unprepare(c)
	}
	var many []time.Duration
	var mu sync.Mutex
	for round := 0; round < 5; round++ {
		var claims []*resourceapi.ResourceClaim
		for i := 0; i < 32; i++ {
			claims = append(claims, claim())
		}
		var wg sync.WaitGroup
		for _, c := range claims {
			wg.Add(1)
			go func(c *resourceapi.ResourceClaim) {
				defer wg.Done()
				start := time.Now()
				requireOK(t, "prepare", k.prepare(c), c)
				mu.Lock()
				many = append(many, time.Since(start))
				mu.Unlock()
			}(c)
		}
		wg.Wait()
		k.unprepare(claims...)
	}
	p := func(d []time.Duration, q float64) float64 { return float64(percentile(d, q).Microseconds()) / 1000 }
	fmt.Printf("NodePrepareResources, 1 claim at a time (%d calls): p50 %.2f ms p99 %.2f ms\n", len(one), p(one, 0.5), p(one, 0.99))
	fmt.Printf("NodePrepareResources, 32 pods at once (%d calls): p50 %.2f ms p99 %.2f ms\n", len(many), p(many, 0.5), p(many, 0.99))
	ok := p(one, 0.99) <= 20 && p(many, 0.99) <= 20
	fmt.Printf(`{"bench":"k8s_node_prepare","one_p50_ms":%.2f,"one_p99_ms":%.2f,"c32_p50_ms":%.2f,"c32_p99_ms":%.2f,"goal_p99_ms":20,"pass":%t}`+"\n",
		p(one, 0.5), p(one, 0.99), p(many, 0.5), p(many, 0.99), ok)
}

// An endpoint that goes down and comes back is republished (endpointUp)
// and reported to the kubelet's health service.
func TestEndpointDownAndUpIsRepublishedAndReportedAsHealth(t *testing.T) {
	l := newLab(t, periodic)
	kube := newFakeAPI()
	rc := l.startDriver("d", kube)
	k := newKubelet(t, rc)
	up := func(want bool) func(map[string]resourceapi.Device) bool {
		return func(d map[string]resourceapi.Device) bool {
			a, ok := d["qpu0"].Attributes["endpointUp"]
			return ok && a.BoolValue != nil && *a.BoolValue == want
		}
	}
	waitSlice(t, kube, "qpu0 endpoint up", up(true))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := drahealthv1.NewDRAResourceHealthClient(k.cc).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	health := func(want drahealthv1.HealthStatus) {
		t.Helper()
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("health stream: %v (waiting for %s)", err, want)
			}
			for _, d := range r.Devices {
				if d.Device.GetDeviceName() == "qpu0" && d.Device.GetPoolName() == nodeName && d.Health == want {
					return
				}
			}
		}
	}
	health(drahealthv1.HealthStatus_HEALTHY)

	stopProc(l.sim) // the control electronics go away
	waitSlice(t, kube, "qpu0 endpoint down", up(false))
	health(drahealthv1.HealthStatus_UNHEALTHY)
	l.sim = l.startSim()
	waitSlice(t, kube, "qpu0 endpoint up again", up(true))
	health(drahealthv1.HealthStatus_HEALTHY)
}
