package driver

// The claim socket: a pod's way into its own reservation.
//
// qrtd books the claim as tenant <driver>/<namespace> and checks every
// jobs.submit against the caller's tenant, which for a pod would be its
// own uid: a pod could not submit into its own reservation.  So each
// prepared claim gets a UNIX socket of its own, served by the driver in
// <plugin-dir>/claims/<uid>/, which the CDI spec bind-mounts (the
// directory, so that a driver restart's new socket is seen) as the
// container's QRT_SOCKET.  The driver forwards what a job needs to qrtd,
// on behalf of the claim's namespace, pinned to the claim's reservations.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"qrtd.io/tools/clients/go/qrtd"
	"qrtd.io/tools/clients/go/qrtproto"
)

// ProxyLimits bound what one claim's socket serves (qrt-dra-driver's
// --claim-* flags).
type ProxyLimits struct {
	// Longest request line (qrtd's rpc.max_line_bytes default): a longer
	// one is answered with line_too_long and the connection closed.
	MaxLineBytes int
	// Connections one claim may hold at once; one more is answered with
	// overloaded (data.cause "connections_per_claim") and closed.
	MaxConns int
	// A connection silent this long is closed (qrtd's rpc.idle_timeout_s).
	IdleTimeout time.Duration
	// Requests per second one claim may send over all its connections
	// (token bucket of RequestBurst), so that one pod cannot use up the
	// driver's own tenants.max_requests_per_s at qrtd, which every
	// namespace's prepare shares.  Beyond it: quota_exceeded
	// (data.quota "claim_requests").
	RequestsPerS float64
	RequestBurst int
}

// DefaultProxyLimits are qrtd's defaults where qrtd has one.
var DefaultProxyLimits = ProxyLimits{MaxLineBytes: 1 << 20, MaxConns: 4, IdleTimeout: 300 * time.Second,
	RequestsPerS: 100, RequestBurst: 200}

func (l ProxyLimits) withDefaults() ProxyLimits {
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = DefaultProxyLimits.MaxLineBytes
	}
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultProxyLimits.MaxConns
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultProxyLimits.IdleTimeout
	}
	if l.RequestsPerS <= 0 {
		l.RequestsPerS = DefaultProxyLimits.RequestsPerS
	}
	if l.RequestBurst <= 0 {
		l.RequestBurst = DefaultProxyLimits.RequestBurst
	}
	return l
}

// How each forwarded method is treated.  Anything else is refused with
// permission_denied: a pod may not book, release or heartbeat (the driver
// owns the reservation's lifetime), update calibrations or subscribe.
type methodRule struct {
	onBehalf bool   // add on_behalf_of = the claim's namespace
	pin      string // the parameter that must name one of the claim's reservations
	events   bool   // served by the driver (job.finished of the claim's reservations)
}

var proxiedMethods = map[string]methodRule{
	qrtproto.MethodAgentHello: {},
	qrtproto.MethodQpusList:   {},
	qrtproto.MethodSlotsQuery: {onBehalf: true},
	qrtproto.MethodJobsSubmit: {onBehalf: true, pin: "reservation_id"},
	qrtproto.MethodJobsStatus: {onBehalf: true, pin: "job_id"},
	qrtproto.MethodJobsResult: {onBehalf: true, pin: "job_id"},
	qrtproto.MethodJobsCancel: {onBehalf: true, pin: "job_id"},
	// qrtd would not push root/<namespace>'s events to the driver: served
	// here (pollJobs).
	qrtproto.MethodEventsSubscribe:   {events: true},
	qrtproto.MethodEventsUnsubscribe: {events: true},
}

// ProxiedMethods is the sorted list of methods a claim socket serves.
func ProxiedMethods() []string {
	var out []string
	for m := range proxiedMethods {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// ClaimSocketName is the socket's name in the claim's directory and in
// the container's (the base name of --container-qrtd-socket).
func (d *Driver) claimSocketName() string { return filepath.Base(d.cfg.ContainerSocket) }

// ClaimDir is the directory of a claim's socket: the CDI bind mount's
// source.
func (d *Driver) ClaimDir(uid types.UID) string {
	return filepath.Join(d.cfg.StateDir, "claims", string(uid))
}

// ClaimSocket is where the driver serves the claim's socket.
func (d *Driver) ClaimSocket(uid types.UID) string {
	return filepath.Join(d.ClaimDir(uid), d.claimSocketName())
}

type claimProxy struct {
	d         *Driver
	uid       types.UID
	namespace string
	name      string
	ids       map[uint64]bool
	ln        net.Listener
	lim       *rate.Limiter
	ctx       context.Context
	cancel    context.CancelFunc

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	subs  map[*proxyConn]struct{}
	wg    sync.WaitGroup
}

// maxUnixPath: sun_path holds 108 bytes with the terminating NUL.
const maxUnixPath = 107

// serveClaim starts the claim's socket (nothing when it is served
// already).  A socket left by a driver that was killed is replaced.
func (d *Driver) serveClaim(cp *Checkpoint) error {
	d.mu.Lock()
	_, ok := d.proxies[cp.UID]
	d.mu.Unlock()
	if ok {
		return nil
	}
	dir, path := d.ClaimDir(cp.UID), d.ClaimSocket(cp.UID)
	if len(path) > maxUnixPath {
		return fmt.Errorf("claim %s/%s: claim socket %s is %d bytes long, over the %d a UNIX socket path may have: use a shorter --plugin-dir",
			cp.Namespace, cp.Name, path, len(path), maxUnixPath)
	}
	// The container's uid, whichever it is, must reach the socket through
	// the bind mount: the directory is searchable and the socket writable
	// by all (claimdir.go).  Host users do not get there: claims/ is 0750,
	// root's.
	dirfd, err := openClaimDir(filepath.Dir(dir), string(cp.UID))
	if err != nil {
		return fmt.Errorf("claim %s/%s: %w", cp.Namespace, cp.Name, err)
	}
	ln, err := listenInClaimDir(dirfd, path, d.claimSocketName())
	unix.Close(dirfd)
	if err != nil {
		return fmt.Errorf("claim %s/%s: serve the claim socket: %w", cp.Namespace, cp.Name, err)
	}
	lim := d.cfg.Proxy
	p := &claimProxy{d: d, uid: cp.UID, namespace: cp.Namespace, name: cp.Name, ids: map[uint64]bool{},
		ln: ln, lim: rate.NewLimiter(rate.Limit(lim.RequestsPerS), lim.RequestBurst), conns: map[net.Conn]struct{}{},
		subs: map[*proxyConn]struct{}{}}
	for _, s := range cp.Slots {
		p.ids[s.ReservationID] = true
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	d.mu.Lock()
	d.proxies[cp.UID] = p
	d.mu.Unlock()
	p.wg.Add(1)
	go p.acceptLoop()
	return nil
}

// stopClaim closes the claim's socket and its connections and removes
// its directory.  Idempotent.
func (d *Driver) stopClaim(uid types.UID, remove bool) error {
	d.mu.Lock()
	p := d.proxies[uid]
	delete(d.proxies, uid)
	d.mu.Unlock()
	if p != nil {
		p.close()
	}
	if !remove {
		return nil
	}
	if u := string(uid); u == "" || u == "." || u == ".." || strings.ContainsRune(u, '/') {
		return nil // no directory of ours: never a path outside claims/
	}
	if err := os.RemoveAll(d.ClaimDir(uid)); err != nil {
		return fmt.Errorf("remove the claim socket: %w", err)
	}
	return nil
}

// stopAllClaims closes every claim socket (the driver stops; a new one
// serves them again from the checkpoints).
func (d *Driver) stopAllClaims() {
	d.mu.Lock()
	var uids []types.UID
	for uid := range d.proxies {
		uids = append(uids, uid)
	}
	d.mu.Unlock()
	for _, uid := range uids {
		_ = d.stopClaim(uid, false)
	}
}

// ServeClaims serves the socket of every claim that is prepared (after a
// restart, from the checkpoints).
func (d *Driver) ServeClaims(ctx context.Context) {
	cps := d.preparedClaims()
	for _, cp := range cps {
		if err := d.serveClaim(cp); err != nil {
			klog.FromContext(ctx).Error(err, "Could not serve a prepared claim's socket", "claim", klog.KRef(cp.Namespace, cp.Name))
		}
	}
}

func (p *claimProxy) close() {
	p.cancel()
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *claimProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() == nil {
				klog.Background().Error(err, "Claim socket stopped accepting", "claim", klog.KRef(p.namespace, p.name))
			}
			return
		}
		p.mu.Lock()
		full := len(p.conns) >= p.d.cfg.Proxy.MaxConns
		if !full {
			p.conns[c] = struct{}{}
		}
		p.mu.Unlock()
		if full {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(errorLine(nil, qrtproto.ReasonOverloaded, fmt.Sprintf("claim %s/%s holds %d connections, the most its socket serves at once",
				p.namespace, p.name, p.d.cfg.Proxy.MaxConns), map[string]any{"cause": "connections_per_claim", "limit": p.d.cfg.Proxy.MaxConns}))
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serveConn(c)
	}
}

// proxyConn is one pod connection: replies and pushed events share it.
type proxyConn struct {
	c          net.Conn
	mu         sync.Mutex // one line at a time
	seq        uint64     // events.event seq, under the proxy's mu
	subscribed bool       // under the proxy's mu
}

func (pc *proxyConn) write(line []byte) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	_ = pc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := pc.c.Write(line)
	return err
}

func (p *claimProxy) serveConn(c net.Conn) {
	defer p.wg.Done()
	pc := &proxyConn{c: c}
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.subs, pc)
		p.mu.Unlock()
		_ = c.Close()
	}()
	lim := p.d.cfg.Proxy
	rd := bufio.NewReaderSize(c, 64<<10)
	for {
		// A subscribed connection may stay silent (as at qrtd).
		p.mu.Lock()
		sub := pc.subscribed
		p.mu.Unlock()
		if sub {
			_ = c.SetReadDeadline(time.Time{})
		} else {
			_ = c.SetReadDeadline(time.Now().Add(lim.IdleTimeout))
		}
		line, err := readLine(rd, lim.MaxLineBytes)
		if errors.Is(err, errLineTooLong) {
			_ = pc.write(errorLine(nil, qrtproto.ReasonLineTooLong, fmt.Sprintf("request line over %d bytes", lim.MaxLineBytes),
				map[string]any{"limit": lim.MaxLineBytes}))
			return
		}
		if err != nil {
			return // EOF, idle timeout, or closed by unprepare
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		out := p.handle(pc, line)
		if out == nil {
			continue
		}
		if err := pc.write(out); err != nil {
			return
		}
	}
}

// Events.  qrtd pushes a tenant's events only to that tenant's own
// connections (and admins'), and a pod is not root/<namespace> to qrtd: so a
// claim socket serves events.subscribe itself, with job.finished only, of
// the claim's own reservations.  They come from qrtd's own event stream:
// the driver subscribes once as a delegate (events.subscribe delegated:
// the events of every root/<namespace> it books for; EventLoop) and
// relays each job.finished, as qrtd sent it, to the subscribed connections
// of the claim whose reservation it is.  As at qrtd, a connection hears
// what finishes after it subscribed.

func (p *claimProxy) subscribe(pc *proxyConn, on bool) (was bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	was = pc.subscribed
	pc.subscribed = on
	if on {
		p.subs[pc] = struct{}{}
	} else {
		delete(p.subs, pc)
	}
	return was
}

// relayFinished hands a job.finished qrtd pushed to the claim whose
// reservation it is (the namespace's tenant, one of the claim's ids).
func (d *Driver) relayFinished(ev qrtd.Event) {
	var data struct {
		ReservationID uint64 `json:"reservation_id"`
	}
	if json.Unmarshal(ev.Data, &data) != nil || data.ReservationID == 0 {
		return
	}
	d.mu.Lock()
	var to *claimProxy
	for _, p := range d.proxies {
		if p.ids[data.ReservationID] && strings.HasSuffix(ev.Tenant, "/"+p.namespace) {
			to = p
			break
		}
	}
	d.mu.Unlock()
	if to != nil {
		to.pushFinished(ev)
	}
}

// pushFinished sends the event to each subscribed connection, with that
// connection's own seq.
func (p *claimProxy) pushFinished(ev qrtd.Event) {
	p.mu.Lock()
	subs := make([]*proxyConn, 0, len(p.subs))
	seqs := make([]uint64, 0, len(p.subs))
	for pc := range p.subs {
		pc.seq++
		subs = append(subs, pc)
		seqs = append(seqs, pc.seq)
	}
	p.mu.Unlock()
	for i, pc := range subs {
		line, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": qrtproto.EventMethod, "params": map[string]any{
			"seq": seqs[i], "type": ev.Type, "tenant": ev.Tenant, "data": ev.Data}})
		_ = pc.write(append(line, '\n'))
	}
}

func (p *claimProxy) handleEvents(pc *proxyConn, method string, params map[string]json.RawMessage) ([]byte, *qrtd.Error) {
	if pc == nil {
		return nil, &qrtd.Error{Code: qrtproto.CodeInternalError, Message: "no connection", Data: map[string]any{"reason": qrtproto.ReasonInternalError}}
	}
	if method == qrtproto.MethodEventsUnsubscribe {
		was := p.subscribe(pc, false)
		out, _ := json.Marshal(map[string]any{"subscribed": false, "was_subscribed": was})
		return out, nil
	}
	for k := range params {
		if k != "topics" {
			return nil, &qrtd.Error{Code: qrtproto.CodeInvalidParams, Message: fmt.Sprintf("unknown parameter '%s' (accepted: topics)", truncate(k, 64)),
				Data: map[string]any{"reason": qrtproto.ReasonInvalidParams, "field": truncate(k, 64)}}
		}
	}
	if raw, ok := params["topics"]; ok {
		var topics []string
		if err := json.Unmarshal(raw, &topics); err != nil {
			return nil, &qrtd.Error{Code: qrtproto.CodeInvalidParams, Message: "topics must be an array of strings",
				Data: map[string]any{"reason": qrtproto.ReasonInvalidParams, "field": "topics"}}
		}
		for _, t := range topics {
			if t != qrtproto.EventJobFinished {
				return nil, &qrtd.Error{Code: qrtproto.CodeInvalidParams, Message: fmt.Sprintf("a claim socket pushes only job.finished, of the claim's own reservations, not %q", truncate(t, 64)),
					Data: map[string]any{"reason": qrtproto.ReasonInvalidParams, "field": "topics"}}
			}
		}
	}
	p.subscribe(pc, true)
	out, _ := json.Marshal(map[string]any{"subscribed": true, "topics": []string{qrtproto.EventJobFinished}, "next_seq": 1, "scope": "claim"})
	return out, nil
}

var errLineTooLong = errors.New("line too long")

func readLine(rd *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := rd.ReadLine()
		if err != nil {
			return nil, err
		}
		if len(line)+len(chunk) > max {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		if !isPrefix {
			return line, nil
		}
	}
}

func errorLine(id json.RawMessage, reason, message string, data map[string]any) []byte {
	if data == nil {
		data = map[string]any{}
	}
	data["reason"] = reason
	code := qrtproto.CodeFor(reason)
	if code == qrtproto.CodeUnlistedReason {
		code = qrtproto.CodeInternalError
	}
	return replyLine(id, nil, &qrtd.Error{Code: code, Message: message, Data: data})
}

func replyLine(id json.RawMessage, result json.RawMessage, e *qrtd.Error) []byte {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	var out []byte
	var err error
	if e != nil {
		out, err = json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   *qrtd.Error     `json:"error"`
		}{"2.0", id, e})
	} else {
		if len(result) == 0 {
			result = json.RawMessage("null")
		}
		out, err = json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Result  json.RawMessage `json:"result"`
		}{"2.0", id, result})
	}
	if err != nil {
		out = fmt.Appendf(nil, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":"encode reply","data":{"reason":%q}}}`,
			qrtproto.CodeInternalError, qrtproto.ReasonInternalError)
	}
	return append(out, '\n')
}

// handle answers one request line (nil: a notification, no answer).
func (p *claimProxy) handle(pc *proxyConn, line []byte) []byte {
	trimmed := bytes.TrimSpace(line)
	// Every line is charged before it is parsed, as qrtd does.
	allowed := p.lim.Allow()
	if trimmed[0] == '[' {
		return errorLine(nil, qrtproto.ReasonInvalidRequest, "the claim socket forwards one request per line: batches are not accepted", nil)
	}
	var req struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(trimmed, &req); err != nil {
		return errorLine(nil, qrtproto.ReasonParseError, "the line is not a JSON object: "+err.Error(), nil)
	}
	notification := req.ID == nil
	answer := func(b []byte) []byte {
		if notification {
			return nil
		}
		return b
	}
	if !allowed {
		return answer(errorLine(req.ID, qrtproto.ReasonQuotaExceeded, fmt.Sprintf("claim %s/%s sends more than %g requests per second (burst %d)",
			p.namespace, p.name, p.d.cfg.Proxy.RequestsPerS, p.d.cfg.Proxy.RequestBurst),
			map[string]any{"quota": "claim_requests", "limit": p.d.cfg.Proxy.RequestsPerS}))
	}
	if req.JSONRPC != "2.0" || req.Method == "" {
		return answer(errorLine(req.ID, qrtproto.ReasonInvalidRequest, `a request needs "jsonrpc": "2.0" and a "method"`, nil))
	}
	rule, ok := proxiedMethods[req.Method]
	if !ok {
		return answer(errorLine(req.ID, qrtproto.ReasonPermissionDenied, fmt.Sprintf("the claim socket does not serve %s; it serves %s",
			truncate(req.Method, 128), strings.Join(ProxiedMethods(), ", ")),
			map[string]any{"method": truncate(req.Method, 128), "allowed": ProxiedMethods()}))
	}
	params := map[string]json.RawMessage{}
	if len(req.Params) > 0 && string(req.Params) != "null" {
		if err := json.Unmarshal(req.Params, &params); err != nil {
			return answer(errorLine(req.ID, qrtproto.ReasonInvalidParams, "params must be an object of named parameters",
				map[string]any{"field": "params"}))
		}
	}
	if _, ok := params["on_behalf_of"]; ok {
		return answer(errorLine(req.ID, qrtproto.ReasonInvalidParams, fmt.Sprintf("on_behalf_of is set by the driver: this claim's calls run for namespace %s", p.namespace),
			map[string]any{"field": "on_behalf_of"}))
	}
	if rule.pin != "" {
		raw, ok := params[rule.pin]
		if !ok {
			return answer(errorLine(req.ID, qrtproto.ReasonInvalidParams, fmt.Sprintf("%s needs %s: one of this claim's reservations (%s)",
				req.Method, rule.pin, p.idList()), map[string]any{"field": rule.pin}))
		}
		var id uint64
		if err := json.Unmarshal(raw, &id); err != nil {
			return answer(errorLine(req.ID, qrtproto.ReasonInvalidParams, fmt.Sprintf("%s must be a reservation id (an unsigned integer)", rule.pin),
				map[string]any{"field": rule.pin}))
		}
		if !p.ids[id] {
			return answer(errorLine(req.ID, qrtproto.ReasonPermissionDenied, fmt.Sprintf("%s %d is not a reservation of claim %s/%s (%s)",
				rule.pin, id, p.namespace, p.name, p.idList()), map[string]any{"field": rule.pin}))
		}
	}
	if rule.events {
		res, e := p.handleEvents(pc, req.Method, params)
		return answer(replyLine(req.ID, res, e))
	}
	if rule.onBehalf {
		ns, _ := json.Marshal(p.namespace)
		params["on_behalf_of"] = ns
	}
	var result json.RawMessage
	err := p.d.client.Call(p.ctx, req.Method, params, &result)
	var qe *qrtd.Error
	switch {
	case err == nil:
		if req.Method == qrtproto.MethodJobsSubmit {
			p.submitted(params[rule.pin], result)
		}
		return answer(replyLine(req.ID, result, nil))
	case errors.As(err, &qe):
		return answer(replyLine(req.ID, nil, qe))
	default:
		return answer(errorLine(req.ID, qrtproto.ReasonUnavailable, "the driver could not ask qrtd: "+err.Error(), map[string]any{"cause": "qrtd"}))
	}
}

// submitted: the pod's job is in its reservation, which qrtd holds no
// more (its state is the job's now): the driver stops heartbeating it.
// Off the connection's goroutine, which an unprepare in progress waits
// for while it holds the claim.
func (p *claimProxy) submitted(rawID json.RawMessage, result json.RawMessage) {
	var id uint64
	var r struct {
		State string `json:"state"`
	}
	if json.Unmarshal(rawID, &id) != nil || json.Unmarshal(result, &r) != nil || r.State == SlotHeld {
		return
	}
	go p.d.setSlotState(p.uid, id, SlotCommitted)
}

func (p *claimProxy) idList() string {
	var ids []string
	for id := range p.ids {
		ids = append(ids, fmt.Sprint(id))
	}
	sort.Strings(ids)
	return "reservation_id " + strings.Join(ids, ", ")
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
