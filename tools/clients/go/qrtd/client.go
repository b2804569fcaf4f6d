// Package qrtd is a JSON-RPC 2.0 client of qrtd(8)'s UNIX socket, written
// with Go's standard library alone: one request per line, one reply per
// line (qrtd(8) PROTOCOL).  No cgo: the driver stays a static Go binary
// that builds wherever client-go does, and the protocol is a few lines of
// encoding/json -- what libqrt-client would add (its own framing over the
// same socket) is not worth a C toolchain in the image.
package qrtd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"qrtd.io/tools/clients/go/qrtproto"
)

// Error is a JSON-RPC error reply from qrtd: its reason (data.reason,
// e.g. "no_fit", "quota_exceeded"), message and data.
type Error struct {
	Code    int            `json:"code"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data"`
}

func (e *Error) Error() string { return fmt.Sprintf("qrtd: %s (%s)", e.Message, e.Reason()) }

// Reason is qrtd's stable error reason, "" when it gave none.
func (e *Error) Reason() string {
	r, _ := e.Data["reason"].(string)
	return r
}

// ReasonOf is the qrtd reason of err, "" when err is no qrtd error.
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason()
	}
	return ""
}

// MaxLineBytes bounds one reply line (qrtd's own request limit is 1 MiB).
const MaxLineBytes = 4 << 20

type conn struct {
	c  net.Conn
	rd *bufio.Reader
}

// Client calls qrtd over a small pool of connections (at most PoolSize
// open at once; callers beyond it wait).  Safe for concurrent use.
type Client struct {
	path    string
	timeout time.Duration
	pool    chan *conn
	slots   chan struct{}
	nextID  atomic.Uint64
}

// PoolSize is how many connections one Client keeps open at most.
const PoolSize = 12

// New returns a client of the socket at path; every call is bounded by
// timeout (and by its context).
func New(path string, timeout time.Duration) *Client {
	c := &Client{path: path, timeout: timeout, pool: make(chan *conn, PoolSize),
		slots: make(chan struct{}, PoolSize)}
	return c
}

// Path is the socket this client dials.
func (c *Client) Path() string { return c.path }

func (c *Client) get(ctx context.Context) (*conn, error) {
	select {
	case cn := <-c.pool:
		return cn, nil
	default:
	}
	select {
	case c.slots <- struct{}{}:
	case cn := <-c.pool:
		return cn, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.path)
	if err != nil {
		<-c.slots
		return nil, fmt.Errorf("qrtd: connect %s: %w", c.path, err)
	}
	return &conn{c: nc, rd: bufio.NewReaderSize(nc, 64<<10)}, nil
}

func (c *Client) put(cn *conn, broken bool) {
	if broken {
		_ = cn.c.Close()
		<-c.slots
		return
	}
	c.pool <- cn
}

// Close closes the idle connections.
func (c *Client) Close() {
	for {
		select {
		case cn := <-c.pool:
			_ = cn.c.Close()
			<-c.slots
		default:
			return
		}
	}
}

type request struct {
	JSONRPC string `json:"jsonrpc"`
	ID      uint64 `json:"id"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

type reply struct {
	ID     *uint64         `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  *Error          `json:"error"`
}

// Call sends method(params) and decodes the result into out (nil: drop
// it).  A qrtd error reply is an *Error.
func (c *Client) Call(ctx context.Context, method string, params any, out any) error {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	cn, err := c.get(ctx)
	if err != nil {
		return err
	}
	broken := true
	defer func() { c.put(cn, broken) }()
	if dl, ok := ctx.Deadline(); ok {
		_ = cn.c.SetDeadline(dl)
	}
	id := c.nextID.Add(1)
	line, err := json.Marshal(request{JSONRPC: "2.0", ID: id, Method: method, Params: params})
	if err != nil {
		return fmt.Errorf("qrtd: %s: encode params: %w", method, err)
	}
	if _, err := cn.c.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("qrtd: %s: send: %w", method, err)
	}
	for {
		r, err := readReply(cn.rd)
		if err != nil {
			return fmt.Errorf("qrtd: %s: %w", method, err)
		}
		if r.ID == nil || *r.ID != id {
			continue // a notification on a pooled connection: not ours
		}
		broken = false
		if r.Error != nil {
			return r.Error
		}
		if out != nil {
			if err := json.Unmarshal(r.Result, out); err != nil {
				return fmt.Errorf("qrtd: %s: decode result: %w", method, err)
			}
		}
		return nil
	}
}

func readReply(rd *bufio.Reader) (*reply, error) {
	var line []byte
	for {
		chunk, isPrefix, err := rd.ReadLine()
		if err != nil {
			return nil, fmt.Errorf("read reply: %w", err)
		}
		line = append(line, chunk...)
		if len(line) > MaxLineBytes {
			return nil, fmt.Errorf("reply line over %d bytes", MaxLineBytes)
		}
		if !isPrefix {
			break
		}
	}
	var r reply
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("decode reply: %w", err)
	}
	return &r, nil
}

// Event is one events.event notification.
type Event struct {
	Seq    uint64          `json:"seq"`
	Type   string          `json:"type"`
	Tenant string          `json:"tenant,omitempty"`
	Data   json.RawMessage `json:"data"`
}

// Subscribe opens a connection of its own, subscribes to topics (nil:
// all) and sends every event to the returned channel until ctx ends or the
// connection breaks; then the channel is closed.
//
// delegated: also the events of the tenants this delegate books for
// (DELEGATE/NAME: qrtd's events.subscribe "delegated"; the caller must be
// in tenants.delegates).
func (c *Client) Subscribe(ctx context.Context, topics []string, delegated bool) (<-chan Event, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.path)
	if err != nil {
		return nil, fmt.Errorf("qrtd: connect %s: %w", c.path, err)
	}
	params := map[string]any{}
	if len(topics) > 0 {
		params["topics"] = topics
	}
	if delegated {
		params["delegated"] = true
	}
	line, _ := json.Marshal(request{JSONRPC: "2.0", ID: 1, Method: qrtproto.MethodEventsSubscribe, Params: params})
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(append(line, '\n')); err != nil {
		nc.Close()
		return nil, fmt.Errorf("qrtd: events.subscribe: %w", err)
	}
	rd := bufio.NewReaderSize(nc, 64<<10)
	r, err := readReply(rd)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("qrtd: events.subscribe: %w", err)
	}
	if r.Error != nil {
		nc.Close()
		return nil, r.Error
	}
	_ = nc.SetDeadline(time.Time{})
	out := make(chan Event, 64)
	var once sync.Once
	stop := func() { once.Do(func() { nc.Close() }) }
	go func() {
		<-ctx.Done()
		stop()
	}()
	go func() {
		defer close(out)
		defer stop()
		for {
			line, err := rd.ReadBytes('\n')
			if err != nil || len(line) > MaxLineBytes {
				return
			}
			var n struct {
				Method string `json:"method"`
				Params Event  `json:"params"`
			}
			if json.Unmarshal(line, &n) != nil || n.Method != qrtproto.EventMethod {
				continue
			}
			select {
			case out <- n.Params:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
