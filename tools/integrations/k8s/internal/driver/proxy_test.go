package driver

// A pod's calls through its claim's socket, against a real qrtd and
// qpu-sim.  The pod is a child process (this test binary) that opens the
// claim's directory as root -- as the container runtime resolves the
// CDI bind mount's source -- and then becomes uid nobody, so it reaches the
// socket only as a container's process would.

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"qrtd.io/tools/clients/go/qrtd"
)

const nobody = 65534

// podMain: QRT_POD_DIR names a claim's directory.  As root, with
// QRT_POD_MOUNT (a directory) and QRT_POD_MOUNT_OPTIONS (the CDI mount's
// options), the pod is in a mount namespace of its own (the parent unshared
// it) and mounts the directory there as runc does a bind mount: bind, then
// a remount with the options' flags (ro, nosuid, ...).  It then tries, still
// root, to create a file in the mount.  The first line out is
// {"uid":..,"direct_error":..,"write_error":..}: the uid the pod runs as,
// what connecting to the socket by its host path gave, and what creating a
// file in the mount gave; then stdin and stdout are the connection to the
// socket.
func podMain(dir string) int {
	info := map[string]any{}
	mounted := dir
	if target := os.Getenv("QRT_POD_MOUNT"); target != "" {
		if err := syscall.Mount(dir, target, "", syscall.MS_BIND, ""); err != nil {
			fmt.Fprintln(os.Stderr, "pod: bind mount:", err)
			return 1
		}
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT)
		for _, o := range strings.Split(os.Getenv("QRT_POD_MOUNT_OPTIONS"), ",") {
			flags |= map[string]uintptr{"ro": syscall.MS_RDONLY, "nosuid": syscall.MS_NOSUID,
				"nodev": syscall.MS_NODEV, "noexec": syscall.MS_NOEXEC}[o]
		}
		if err := syscall.Mount("", target, "", flags, ""); err != nil {
			fmt.Fprintln(os.Stderr, "pod: remount:", err)
			return 1
		}
		mounted = target
		if err := os.WriteFile(filepath.Join(target, "fill"), []byte("x"), 0o600); err != nil {
			info["write_error"] = err.Error()
		}
	}
	fd, err := syscall.Open(mounted, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pod:", err)
		return 1
	}
	if err := syscall.Fchdir(fd); err != nil {
		fmt.Fprintln(os.Stderr, "pod:", err)
		return 1
	}
	if os.Geteuid() == 0 {
		if err := syscall.Setgroups(nil); err != nil {
			fmt.Fprintln(os.Stderr, "pod: setgroups:", err)
			return 1
		}
		if err := syscall.Setgid(nobody); err != nil {
			fmt.Fprintln(os.Stderr, "pod: setgid:", err)
			return 1
		}
		if err := syscall.Setuid(nobody); err != nil {
			fmt.Fprintln(os.Stderr, "pod: setuid:", err)
			return 1
		}
	}
	info["uid"] = os.Getuid()
	if c, err := net.Dial("unix", filepath.Join(dir, "qrtd.sock")); err != nil {
		info["direct_error"] = err.Error()
	} else {
		c.Close()
	}
	c, err := net.Dial("unix", "qrtd.sock") // relative to the directory: the mount
	if err != nil {
		info["error"] = err.Error()
	}
	line, _ := json.Marshal(info)
	os.Stdout.Write(append(line, '\n'))
	if err != nil {
		return 1
	}
	go func() {
		_, _ = io.Copy(c, os.Stdin)
		_ = c.(*net.UnixConn).CloseWrite()
	}()
	_, _ = io.Copy(os.Stdout, c)
	return 0
}

type podConn struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	uid  int
	// What connecting by the host path gave the pod's uid, and what
	// creating a file in its mount of the claim's directory gave root
	// (mounted: whether it was mounted, as root only).
	directErr, writeErr string
	mounted             bool
	id                  int
	events              []pushedEvent
}

type pushedEvent struct {
	Seq  uint64 `json:"seq"`
	Type string `json:"type"`
	Data struct {
		ReservationID uint64 `json:"reservation_id"`
		State         string `json:"state"`
	} `json:"data"`
}

type rpcError struct {
	Code    int            `json:"code"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data"`
}

func (e *rpcError) reason() string { r, _ := e.Data["reason"].(string); return r }
func (e *rpcError) field() string  { r, _ := e.Data["field"].(string); return r }

func startPod(t *testing.T, rc RunConfig, c *resourceapi.ResourceClaim) *podConn {
	t.Helper()
	// The claim's directory as the CDI spec mounts it (the mount a
	// container runtime makes), in a mount namespace of the pod's own.
	m := slotOf(t, rc.CDIDir, CDIKind+"="+string(c.UID)).Mount
	if m == nil {
		t.Fatalf("pod %s: its claim's CDI spec mounts nothing at /run/qrtd", c.Name)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "QRT_POD_DIR="+m.Source)
	mounted := os.Geteuid() == 0
	if mounted {
		target := filepath.Join(t.TempDir(), "run-qrtd")
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(cmd.Env, "QRT_POD_MOUNT="+target, "QRT_POD_MOUNT_OPTIONS="+strings.Join(m.Options, ","))
		// Go makes / private in the new namespace: nothing the pod
		// mounts is seen outside, and it all goes when the pod ends.
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &podConn{t: t, name: c.Name, cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20)}
	t.Cleanup(func() { p.in.Close(); stopProc(cmd) })
	var info struct {
		UID         int    `json:"uid"`
		DirectError string `json:"direct_error"`
		WriteError  string `json:"write_error"`
		Error       string `json:"error"`
	}
	line, err := p.out.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &info) != nil {
		t.Fatalf("pod %s: %q %v", c.Name, line, err)
	}
	if info.Error != "" {
		t.Fatalf("pod %s (uid %d) cannot connect to its claim socket: %s", c.Name, info.UID, info.Error)
	}
	p.uid, p.directErr, p.writeErr, p.mounted = info.UID, info.DirectError, info.WriteError, mounted
	return p
}

// call sends one request and reads its reply: the result, or the error.
func (p *podConn) call(method string, params any) (json.RawMessage, *rpcError) {
	p.t.Helper()
	p.id++
	line, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": p.id, "method": method, "params": params})
	if _, err := p.in.Write(append(line, '\n')); err != nil {
		p.t.Fatalf("pod %s: send %s: %v", p.name, method, err)
	}
	return readReplyOf(p.t, p.out, p.id, p.name+" "+method, &p.events)
}

// readReplyOf reads the reply to request id (0: any), keeping the
// events.event notifications met on the way in events.
func readReplyOf(t *testing.T, rd *bufio.Reader, id int, what string, events ...*[]pushedEvent) (json.RawMessage, *rpcError) {
	t.Helper()
	var r struct {
		ID     *int            `json:"id"`
		Method string          `json:"method"`
		Params pushedEvent     `json:"params"`
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	var line []byte
	for {
		var err error
		line, err = rd.ReadBytes('\n')
		if err != nil {
			t.Fatalf("%s: no reply: %v", what, err)
		}
		r.ID, r.Method, r.Result, r.Error = nil, "", nil, nil
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("%s: reply %q: %v", what, line, err)
		}
		if r.Method == "" {
			break
		}
		if r.Method != "events.event" || len(events) == 0 {
			t.Fatalf("%s: unexpected notification %q", what, line)
		}
		*events[0] = append(*events[0], r.Params)
	}
	if id != 0 && (r.ID == nil || *r.ID != id) {
		t.Fatalf("%s: reply %q does not carry id %d", what, line, id)
	}
	return r.Result, r.Error
}

func (p *podConn) ok(method string, params any, out any) {
	p.t.Helper()
	res, e := p.call(method, params)
	if e != nil {
		p.t.Fatalf("pod %s: %s: %+v", p.name, method, e)
	}
	if out != nil {
		if err := json.Unmarshal(res, out); err != nil {
			p.t.Fatalf("pod %s: %s result %s: %v", p.name, method, res, err)
		}
	}
}

func (p *podConn) refused(method string, params any, reason, field string) *rpcError {
	p.t.Helper()
	res, e := p.call(method, params)
	if e == nil {
		p.t.Fatalf("pod %s: %s succeeded (%s), want %s", p.name, method, res, reason)
	}
	if e.reason() != reason || (field != "" && e.field() != field) {
		p.t.Fatalf("pod %s: %s refused with %+v, want reason %s field %q", p.name, method, e, reason, field)
	}
	return e
}

// payload: a job of 2000 bytes (qpu-sim runs anything; qrtd reads shots).
func payload(tag string) string {
	body := fmt.Sprintf(`{"shots":10,"tag":%q,"pad":"`, tag)
	body += strings.Repeat("x", 2000-len(body)-2) + `"}`
	return base64.StdEncoding.EncodeToString([]byte(body))
}

func TestAPodSubmitsIntoItsOwnReservationThroughItsClaimSocket(t *testing.T) {
	l := newLab(t, periodic)
	kube := newFakeAPI()
	rc := l.startDriver("d", kube)
	k := newKubelet(t, rc)
	waitSlice(t, kube, "the ResourceSlice", func(d map[string]resourceapi.Device) bool { return len(d) >= 1 })

	T := slotStart(4 * time.Second)
	params := slotParams(fmt.Sprintf(`"duration":"20ms","notBefore":%q,"deadline":%q`, rfc(T), rfc(T.Add(time.Second))))
	a := newClaim("team-a", "a", params, "qpu0")
	a2 := newClaim("team-a", "a2", params, "qpu0")
	b := newClaim("team-b", "b", params, "qpu0")
	ex := newClaim("team-c", "ex", params, "qpu0")
	createClaims(t, kube, a, a2, b, ex)
	resp := k.prepare(a, a2, b, ex)
	slot := map[string]slotEnv{}
	for _, c := range []*resourceapi.ResourceClaim{a, a2, b, ex} {
		s := slotOf(t, rc.CDIDir, requireOK(t, "prepare", resp, c).Devices[0].CdiDeviceIds[0])
		if s.Env["QRT_SOCKET"] != "/run/qrtd/qrtd.sock" || s.Mount == nil || s.Mount.Source != filepath.Join(rc.PluginDir, "claims", string(c.UID)) {
			t.Fatalf("claim %s: the container does not get its claim socket: env %v mount %+v", c.Name, s.Env, s.Mount)
		}
		if !contains(s.Mount.Options, "ro") || !contains(s.Mount.Options, "bind") {
			t.Errorf("claim %s: the claim's directory is not bind-mounted read-only: %v", c.Name, s.Mount.Options)
		}
		st, err := os.Stat(filepath.Join(s.Mount.Source, "qrtd.sock"))
		if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o666 {
			t.Fatalf("claim %s: claim socket %v %v", c.Name, st, err)
		}
		slot[c.Name] = s
	}

	// A container's own program: the job example of the Slurm plugin
	// (libqrt-client: events.subscribe, jobs.submit, job.finished,
	// jobs.status, jobs.result), with the claim's CDI environment and its
	// claim socket as QRT_SOCKET.  It runs while the rest goes on.
	exDone := make(chan error, 1)
	var exOut []byte
	if bin := os.Getenv("QRT_JOB_EXAMPLE"); bin != "" {
		cmd := exec.Command(bin, "--timeout-s", "30", "--payload", "hello from a pod")
		cmd.Env = os.Environ()
		for k, v := range slot["ex"].Env {
			if k == "QRT_SOCKET" {
				v = filepath.Join(slot["ex"].Mount.Source, "qrtd.sock")
			}
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		go func() {
			var err error
			exOut, err = cmd.CombinedOutput()
			exDone <- err
		}()
	} else {
		t.Log("QRT_JOB_EXAMPLE not given (ctest gives it): the job example is not run")
		close(exDone)
	}

	pa := startPod(t, rc, a)
	if os.Geteuid() == 0 {
		if pa.uid != nobody {
			t.Fatalf("the pod runs as uid %d, not nobody", pa.uid)
		}
		// By its host path the socket is out of a host user's reach.
		if !strings.Contains(pa.directErr, "permission denied") {
			t.Errorf("uid nobody reached the claim socket by its host path: %q", pa.directErr)
		}
		// The pod mounted its claim's directory as the CDI spec says and
		// reaches the socket through it, but even as root it cannot
		// write there (fill the node's disk, plant a symlink).
		if !strings.Contains(pa.writeErr, "read-only file system") {
			t.Errorf("root in the pod could write into its claim's directory: %q", pa.writeErr)
		}
	} else {
		t.Logf("not root: the pod runs as the test's uid %d", pa.uid)
	}
	var hello map[string]any
	pa.ok("agent.hello", map[string]any{"client": "pod"}, &hello)
	var list struct {
		QPUs []map[string]any `json:"qpus"`
	}
	pa.ok("qpus.list", nil, &list)
	if len(list.QPUs) != 1 {
		t.Errorf("qpus.list through the claim socket: %v", list)
	}

	sa, sb := slot["a"], slot["b"]
	// Refused: another claim's reservation, none, a method a pod may not
	// call, and an on_behalf_of of its own.
	e := pa.refused("jobs.submit", map[string]any{"reservation_id": sb.ReservationID, "fencing_token": sb.Token,
		"payload": payload("b")}, "permission_denied", "reservation_id")
	t.Logf("another claim's reservation: %s", e.Message)
	e = pa.refused("jobs.submit", map[string]any{"payload": payload("one-shot"), "duration_ns": 20 * ms,
		"idempotency_key": "x"}, "invalid_params", "reservation_id")
	t.Logf("no reservation: %s", e.Message)
	pa.refused("jobs.status", map[string]any{"job_id": sb.ReservationID}, "permission_denied", "job_id")
	e = pa.refused("slots.reserve", map[string]any{"duration_ns": 20 * ms, "idempotency_key": "y", "lease_ns": 30 * time.Second},
		"permission_denied", "")
	if e.Data["method"] != "slots.reserve" || !strings.Contains(e.Message, "jobs.submit") {
		t.Errorf("a disallowed method's error: %+v", e)
	}
	t.Logf("a disallowed method: %s", e.Message)
	pa.refused("slots.release", map[string]any{"reservation_id": sa.ReservationID, "fencing_token": sa.Token}, "permission_denied", "")
	pa.refused("jobs.submit", map[string]any{"reservation_id": sa.ReservationID, "fencing_token": sa.Token,
		"payload": payload("a"), "on_behalf_of": "team-b"}, "invalid_params", "on_behalf_of")
	if st := l.status("team-b", sb.ReservationID); st.State != "held" {
		t.Fatalf("b's reservation after a's refused calls: %s", st.State)
	}

	// Subscribed first, as qrt-slurm-job-example does: job.finished of its
	// own reservations only.
	var sub0 struct {
		Subscribed bool     `json:"subscribed"`
		Topics     []string `json:"topics"`
	}
	pa.refused("events.subscribe", map[string]any{"topics": []string{"calibration.changed"}}, "invalid_params", "topics")
	pa.ok("events.subscribe", map[string]any{"topics": []string{"job.finished"}}, &sub0)
	if !sub0.Subscribed || len(sub0.Topics) != 1 {
		t.Fatalf("events.subscribe: %+v", sub0)
	}

	// Its own reservation: committed, for the namespace's tenant.
	var sub struct {
		State string `json:"state"`
	}
	pa.ok("jobs.submit", map[string]any{"reservation_id": sa.ReservationID, "fencing_token": sa.Token,
		"payload": payload("a")}, &sub)
	if sub.State != "committed" {
		t.Fatalf("jobs.submit through the claim socket: %s", sub.State)
	}
	if st := l.status("team-a", sa.ReservationID); st.State != "committed" || !strings.HasSuffix(st.Tenant, "/team-a") {
		t.Fatalf("qrtd holds a's job as %+v", st)
	}
	// The namespace's quotas still apply: tenants.max_payload_bytes 3000
	// holds team-a's first 2000 bytes, not a second claim's; team-b's are
	// its own.
	pa2 := startPod(t, rc, a2)
	e = pa2.refused("jobs.submit", map[string]any{"reservation_id": slot["a2"].ReservationID, "fencing_token": slot["a2"].Token,
		"payload": payload("a2")}, "quota_exceeded", "")
	if e.Data["quota"] != "payload_bytes" {
		t.Errorf("a2's submit refused as %+v, want quota payload_bytes", e)
	}
	pb := startPod(t, rc, b)
	pb.ok("jobs.submit", map[string]any{"reservation_id": sb.ReservationID, "fencing_token": sb.Token,
		"payload": payload("b")}, &sub)

	// A silent connection (to a2's socket: a's connections are counted
	// below) is closed after the idle timeout, 3 s in the test; it is read
	// once the jobs are done.
	silent, err := net.Dial("unix", filepath.Join(rc.PluginDir, "claims", string(a2.UID), "qrtd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	_ = silent.SetDeadline(time.Now().Add(30 * time.Second))
	silentRd := bufio.NewReader(silent)

	// Both run at qpu-sim and complete; each pod reads its result (both
	// polled in turn: neither connection goes idle).
	pods := []struct {
		p  *podConn
		id uint64
	}{{pa, sa.ReservationID}, {pb, sb.ReservationID}}
	waitFor(t, "both jobs completed", 20*time.Second, func() bool {
		done := true
		for _, pc := range pods {
			var st status
			var raw json.RawMessage
			pc.p.ok("jobs.status", map[string]any{"job_id": pc.id}, &raw)
			_ = json.Unmarshal(raw, &st)
			if st.State == "failed" || st.State == "missed" {
				t.Fatalf("job %s: %s", pc.p.name, raw)
			}
			done = done && st.State == "completed"
		}
		time.Sleep(50 * time.Millisecond)
		return done
	})
	// The subscribed pod hears its job finish, and nothing of b's.
	waitFor(t, "a's job.finished event", 10*time.Second, func() bool {
		pa.ok("agent.hello", nil, nil)
		return len(pa.events) > 0
	})
	if ev := pa.events[0]; len(pa.events) != 1 || ev.Type != "job.finished" || ev.Data.ReservationID != sa.ReservationID ||
		ev.Data.State != "completed" || ev.Seq != 1 {
		t.Errorf("a's events: %+v", pa.events)
	}
	for _, pc := range pods {
		res, e := pc.p.call("jobs.result", map[string]any{"job_id": pc.id})
		if e != nil || len(res) < 3 {
			t.Errorf("job %s: result %s %+v", pc.p.name, res, e)
		}
	}

	if err, ran := <-exDone; ran {
		if err != nil {
			t.Errorf("the job example through its claim socket: %v\n%s", err, exOut)
		} else if !strings.Contains(string(exOut), "committed") {
			t.Errorf("the job example's output: %s", exOut)
		}
		t.Logf("the job example: %s", strings.TrimSpace(string(exOut)))
	}

	// The limits: line length, connections per claim, idle timeout.
	sock := filepath.Join(rc.PluginDir, "claims", string(a.UID), "qrtd.sock")
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("dial the claim socket: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, bufio.NewReader(c)
	}
	c, rd := dial()
	long := `{"jsonrpc":"2.0","id":1,"method":"agent.hello","params":{"pad":"` + strings.Repeat("x", 5000) + `"}}` + "\n"
	if _, err := c.Write([]byte(long)); err != nil {
		t.Fatal(err)
	}
	if _, e := readReplyOf(t, rd, 0, "a long line"); e == nil || e.reason() != "line_too_long" {
		t.Errorf("a line over the limit: %+v", e)
	}
	if _, err := rd.ReadByte(); err != io.EOF {
		t.Errorf("after line_too_long the connection is not closed: %v", err)
	}
	// pa holds one connection; 3 more fill the claim's 4.
	pa.ok("agent.hello", nil, nil)
	var held []net.Conn
	for i := 0; i < 3; i++ {
		c, rd := dial()
		fmt.Fprintf(c, `{"jsonrpc":"2.0","id":%d,"method":"agent.hello"}`+"\n", i+1)
		if _, e := readReplyOf(t, rd, i+1, "connection"); e != nil {
			t.Fatalf("connection %d: %+v", i+2, e)
		}
		held = append(held, c)
	}
	_, rd = dial()
	if _, e := readReplyOf(t, rd, 0, "a fifth connection"); e == nil || e.reason() != "overloaded" || e.Data["cause"] != "connections_per_claim" {
		t.Errorf("a fifth connection: %+v", e)
	}
	for _, c := range held {
		c.Close()
	}
	// The silent connection opened before the jobs ran has been closed.
	if _, err := silentRd.ReadByte(); err != io.EOF {
		t.Errorf("a silent connection is not closed: %v", err)
	}

	// Unprepare: the socket goes, and the pod's connection with it.
	for uid, r := range k.unprepare(a, a2, b, ex) {
		if r.Error != "" {
			t.Fatalf("unprepare %s: %s", uid, r.Error)
		}
	}
	if _, err := os.Stat(filepath.Join(rc.PluginDir, "claims", string(a.UID))); !os.IsNotExist(err) {
		t.Errorf("a's claim socket directory after unprepare: %v", err)
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Errorf("a's claim socket still answers after unprepare")
	}
	if _, err := pa.out.ReadByte(); err != io.EOF {
		t.Errorf("the pod's connection outlived the unprepare: %v", err)
	}

	// What qpu-sim counted: the two jobs, answered.
	stopProc(l.sim)
	data, err := os.ReadFile(filepath.Join(l.dir, "qpu-sim.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Jobs    int `json:"jobs"`
		Results int `json:"results"`
	}
	want := 2
	if os.Getenv("QRT_JOB_EXAMPLE") != "" {
		want = 3
	}
	if err := json.Unmarshal(data, &sum); err != nil || sum.Jobs != want || sum.Results != want {
		t.Errorf("qpu-sim counted %s, want the %d jobs submitted through the claim sockets", data, want)
	}
}

// claimCall is one call over a claim socket from the test's own uid.
func claimCall(t *testing.T, sock, method string, params any, out any) {
	t.Helper()
	c := qrtd.New(sock, 10*time.Second)
	defer c.Close()
	if err := c.Call(t.Context(), method, params, out); err != nil {
		t.Fatalf("%s over %s: %v", method, sock, err)
	}
}
