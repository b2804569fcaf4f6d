// Package apitest is a loopback stand-in for kube-apiserver, for the
// driver's tests: an HTTP server on 127.0.0.1 serving the REST paths the
// driver uses (core/v1 nodes; resource.k8s.io/v1 resourceslices,
// devicetaintrules and resourceclaims with their status subresource) to a real client-go REST
// clientset.  Every request body is decoded strictly into the k8s.io/api
// types (apimachinery's JSON serializer in strict mode: an unknown or
// duplicated field or a wrong type is a 400, and is recorded so that the
// test fails); objects are kept in client-go's ObjectTracker.  The HTTP
// layer adds what an API server does and the tracker does not: a
// resourceVersion bumped on every write and checked on update and delete
// (409 Conflict), server-set uid, creationTimestamp, generation and
// generateName, the status subresource (a claim's status is dropped on
// create and only written through .../status), label and field selectors,
// and watches (?watch=true, streamed watch events, sendInitialEvents with
// the initial-events-end bookmark) fanned out from every write.
//
// A stand-in, not kube-apiserver: no admission, no validation beyond the
// decoding and the checks above, no authentication (loopback only), no
// protobuf or CBOR (JSON only: a request of another content type is 415).
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

// A resource the server serves.
type resource struct {
	gvr        schema.GroupVersionResource
	kind       string
	namespaced bool
	status     bool // has a status subresource
	newObj     func() runtime.Object
	// The field selectors it supports beyond metadata.name and
	// metadata.namespace, as kube-apiserver's field label conversion.
	fields func(obj runtime.Object) fields.Set
}

var resources = []resource{
	{gvr: corev1.SchemeGroupVersion.WithResource("nodes"), kind: "Node",
		newObj: func() runtime.Object { return &corev1.Node{} }},
	{gvr: resourceapi.SchemeGroupVersion.WithResource("resourceslices"), kind: "ResourceSlice",
		newObj: func() runtime.Object { return &resourceapi.ResourceSlice{} },
		fields: func(obj runtime.Object) fields.Set {
			s := obj.(*resourceapi.ResourceSlice)
			node := ""
			if s.Spec.NodeName != nil {
				node = *s.Spec.NodeName
			}
			return fields.Set{resourceapi.ResourceSliceSelectorNodeName: node,
				resourceapi.ResourceSliceSelectorDriver: s.Spec.Driver, resourceapi.ResourceSliceSelectorPoolName: s.Spec.Pool.Name}
		}},
	{gvr: resourceapi.SchemeGroupVersion.WithResource("resourceclaims"), kind: "ResourceClaim", namespaced: true, status: true,
		newObj: func() runtime.Object { return &resourceapi.ResourceClaim{} }},
	{gvr: resourceapi.SchemeGroupVersion.WithResource("devicetaintrules"), kind: "DeviceTaintRule",
		newObj: func() runtime.Object { return &resourceapi.DeviceTaintRule{} }},
}

// Server is the loopback API server.
type Server struct {
	URL string

	http    *httptest.Server
	tracker k8stesting.ObjectTracker
	decoder runtime.Decoder // strict

	mu       sync.Mutex // orders every write, and a watch's start against them
	rv       int64
	watchers map[*watcher]struct{}
	rejected []string
	counts   map[string]int
	done     chan struct{}
	once     sync.Once
}

// MaxWatchBacklog: events queued for one watch before the server closes
// it (the client lists and watches again), as kube-apiserver does to a
// watcher that does not keep up.
const MaxWatchBacklog = 1000

type watcher struct {
	res    *resource
	ns     string
	sel    func(runtime.Object) bool
	events chan watch.Event
	closed bool // overflowed: the server closed it
}

// NewServer starts a server on 127.0.0.1; Close stops it.
func NewServer() *Server {
	s := &Server{
		tracker:  k8stesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder()),
		decoder:  jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, jsonserializer.SerializerOptions{Strict: true}),
		rv:       1,
		watchers: map[*watcher]struct{}{},
		counts:   map[string]int{},
		done:     make(chan struct{}),
	}
	s.http = httptest.NewServer(http.HandlerFunc(s.serve)) // 127.0.0.1:0
	s.URL = s.http.URL
	return s
}

// T is what New needs of a *testing.T.
type T interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
}

// New starts a server for the test: stopped when it ends, and the test
// fails if the server refused any request body or was asked for a path it
// does not serve.
func New(t T) *Server {
	t.Helper()
	s := NewServer()
	t.Cleanup(func() {
		for _, r := range s.Rejected() {
			t.Errorf("the API server refused a request: %s", r)
		}
		s.Close()
	})
	return s
}

// Close stops the server (and ends its watches).
func (s *Server) Close() {
	s.once.Do(func() { close(s.done) })
	s.http.CloseClientConnections()
	s.http.Close()
}

// Config is a client-go REST config for the server (JSON on the wire).
func (s *Server) Config() *rest.Config {
	return &rest.Config{Host: s.URL, QPS: 1000, Burst: 1000, UserAgent: "qrtd-apitest",
		ContentConfig: rest.ContentConfig{ContentType: runtime.ContentTypeJSON, AcceptContentTypes: runtime.ContentTypeJSON}}
}

// Rejected lists the requests refused as malformed (body, path, content
// type), each with the reason.
func (s *Server) Rejected() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.rejected...)
}

// Count is how many requests of a verb ("create", "update",
// "updateStatus", "patch", "delete", "deletecollection", "get", "list",
// "watch") on a resource ("resourceslices") the server answered.
func (s *Server) Count(verb, resource string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[verb+" "+resource]
}

// Add stores an object as if created by a client (uid, resourceVersion set).
func (s *Server) Add(obj runtime.Object) error {
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		return err
	}
	for i := range resources {
		if resources[i].kind == gvks[0].Kind && resources[i].gvr.GroupVersion() == gvks[0].GroupVersion() {
			m, _ := meta.Accessor(obj)
			_, st := s.create(&resources[i], m.GetNamespace(), obj.DeepCopyObject())
			if st != nil {
				return st
			}
			return nil
		}
	}
	return fmt.Errorf("apitest: %v is not served", gvks[0])
}

// ------------------------------------------------------------ routing

type request struct {
	res         *resource
	ns, name    string
	subresource string
}

// route parses /api/v1/... and /apis/GROUP/VERSION/...
func route(path string) (*request, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	var gv schema.GroupVersion
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		gv, parts = schema.GroupVersion{Version: parts[1]}, parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		gv, parts = schema.GroupVersion{Group: parts[1], Version: parts[2]}, parts[3:]
	default:
		return nil, false
	}
	r := &request{}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		r.ns, parts = parts[1], parts[2:]
	}
	for i := range resources {
		if resources[i].gvr.GroupVersion() == gv && resources[i].gvr.Resource == parts[0] {
			r.res = &resources[i]
		}
	}
	if r.res == nil || len(parts) > 3 || (r.ns != "" && !r.res.namespaced) {
		return nil, false
	}
	if len(parts) >= 2 {
		r.name = parts[1]
	}
	if len(parts) == 3 {
		r.subresource = parts[2]
		if parts[2] != "status" || !r.res.status {
			return nil, false
		}
	}
	return r, true
}

func (s *Server) serve(w http.ResponseWriter, hr *http.Request) {
	r, ok := route(hr.URL.Path)
	if !ok {
		s.reject(w, hr, apierrors.NewNotFound(schema.GroupResource{Resource: hr.URL.Path}, ""), "path not served")
		return
	}
	q := hr.URL.Query()
	verb := ""
	var st error
	var out runtime.Object
	code := http.StatusOK
	switch {
	case hr.Method == http.MethodGet && r.name == "" && (q.Get("watch") == "true" || q.Get("watch") == "1"):
		s.count("watch", r.res)
		s.watch(w, hr, r)
		return
	case hr.Method == http.MethodGet && r.name == "":
		verb = "list"
		out, st = s.list(r, q)
	case hr.Method == http.MethodGet:
		verb = "get"
		out, st = s.get(r.res, r.ns, r.name)
	case hr.Method == http.MethodPost && r.name == "":
		verb = "create"
		var obj runtime.Object
		if obj, ok = s.decodeBody(w, hr, r.res); !ok {
			return
		}
		out, st = s.create(r.res, r.ns, obj)
		code = http.StatusCreated
	case hr.Method == http.MethodPut && r.name != "":
		verb = "update"
		if r.subresource == "status" {
			verb = "updateStatus"
		}
		var obj runtime.Object
		if obj, ok = s.decodeBody(w, hr, r.res); !ok {
			return
		}
		out, st = s.update(r, obj)
	case hr.Method == http.MethodPatch && r.name != "":
		verb = "patch"
		out, st, ok = s.patch(w, hr, r)
		if !ok {
			return
		}
	case hr.Method == http.MethodDelete:
		opts, ok := s.deleteOptions(w, hr)
		if !ok {
			return
		}
		if r.name == "" {
			verb = "deletecollection"
			out, st = s.deleteCollection(r, q, opts)
		} else {
			verb = "delete"
			out, st = s.delete(r.res, r.ns, r.name, opts)
		}
	default:
		st = apierrors.NewMethodNotSupported(r.res.gvr.GroupResource(), hr.Method)
	}
	if verb != "" {
		s.count(verb, r.res)
	}
	if st != nil {
		writeStatus(w, st)
		return
	}
	writeObject(w, code, out)
}

func (s *Server) count(verb string, res *resource) {
	s.mu.Lock()
	s.counts[verb+" "+res.gvr.Resource]++
	s.mu.Unlock()
}

// reject answers a malformed request and records it.
func (s *Server) reject(w http.ResponseWriter, hr *http.Request, err error, why string) {
	s.mu.Lock()
	s.rejected = append(s.rejected, fmt.Sprintf("%s %s: %s: %v", hr.Method, hr.URL.Path, why, err))
	s.mu.Unlock()
	writeStatus(w, err)
}

// ------------------------------------------------------------ bodies

const maxBody = 3 << 20 // kube-apiserver's limit on a request body

func (s *Server) readBody(w http.ResponseWriter, hr *http.Request, types ...string) ([]byte, bool) {
	ct := hr.Header.Get("Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	okType := false
	for _, t := range types {
		okType = okType || strings.TrimSpace(ct) == t
	}
	if !okType {
		s.reject(w, hr, apierrors.NewGenericServerResponse(http.StatusUnsupportedMediaType, hr.Method, schema.GroupResource{}, "",
			fmt.Sprintf("the body of type %q is not served: %v only", ct, types), 0, false), "content type")
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(hr.Body, maxBody+1))
	if err == nil && len(body) > maxBody {
		err = fmt.Errorf("the request body is over %d bytes", maxBody)
	}
	if err != nil {
		s.reject(w, hr, apierrors.NewRequestEntityTooLargeError(err.Error()), "body")
		return nil, false
	}
	return body, true
}

// decodeBody decodes a request body strictly into the resource's type.
func (s *Server) decodeBody(w http.ResponseWriter, hr *http.Request, res *resource) (runtime.Object, bool) {
	body, ok := s.readBody(w, hr, runtime.ContentTypeJSON)
	if !ok {
		return nil, false
	}
	obj, err := s.strict(body, res)
	if err != nil {
		s.reject(w, hr, apierrors.NewBadRequest(err.Error()), "body")
		return nil, false
	}
	return obj, true
}

func (s *Server) strict(body []byte, res *resource) (runtime.Object, error) {
	want := res.gvr.GroupVersion().WithKind(res.kind)
	obj, gvk, err := s.decoder.Decode(body, &want, res.newObj())
	if err != nil {
		return nil, fmt.Errorf("the body is not a strict %s: %w", want, err)
	}
	if *gvk != want {
		return nil, fmt.Errorf("the body is a %s, not a %s", gvk, want)
	}
	return obj, nil
}

func (s *Server) deleteOptions(w http.ResponseWriter, hr *http.Request) (*metav1.DeleteOptions, bool) {
	opts := &metav1.DeleteOptions{}
	if hr.ContentLength == 0 {
		return opts, true
	}
	body, ok := s.readBody(w, hr, runtime.ContentTypeJSON)
	if !ok {
		return nil, false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return opts, true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(opts); err != nil {
		s.reject(w, hr, apierrors.NewBadRequest("the body is not a strict DeleteOptions: "+err.Error()), "body")
		return nil, false
	}
	return opts, true
}

// ------------------------------------------------------------ verbs

func (s *Server) get(res *resource, ns, name string) (runtime.Object, error) {
	return s.tracker.Get(res.gvr, ns, name)
}

func rvOf(obj runtime.Object) int64 {
	m, _ := meta.Accessor(obj)
	n, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
	return n
}

// selector parses labelSelector and fieldSelector as kube-apiserver does
// for the resource.
func selector(res *resource, q map[string][]string) (func(runtime.Object) bool, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	ls, err := labels.Parse(get("labelSelector"))
	if err != nil {
		return nil, apierrors.NewBadRequest("labelSelector: " + err.Error())
	}
	fs, err := fields.ParseSelector(get("fieldSelector"))
	if err != nil {
		return nil, apierrors.NewBadRequest("fieldSelector: " + err.Error())
	}
	supported := fields.Set{"metadata.name": "", "metadata.namespace": ""}
	if res.fields != nil {
		for k := range res.fields(res.newObj()) {
			supported[k] = ""
		}
	}
	for _, r := range fs.Requirements() {
		if _, ok := supported[r.Field]; !ok {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", r.Field))
		}
	}
	return func(obj runtime.Object) bool {
		m, err := meta.Accessor(obj)
		if err != nil {
			return false
		}
		set := fields.Set{"metadata.name": m.GetName(), "metadata.namespace": m.GetNamespace()}
		if res.fields != nil {
			for k, v := range res.fields(obj) {
				set[k] = v
			}
		}
		return ls.Matches(labels.Set(m.GetLabels())) && fs.Matches(set)
	}, nil
}

// items: the stored objects of a resource in ns ("" all) that match.
func (s *Server) items(res *resource, ns string, match func(runtime.Object) bool) ([]runtime.Object, error) {
	list, err := s.tracker.List(res.gvr, res.gvr.GroupVersion().WithKind(res.kind), ns)
	if err != nil {
		return nil, err
	}
	all, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	var out []runtime.Object
	for _, o := range all {
		if match(o) {
			out = append(out, o)
		}
	}
	return out, nil
}

func (s *Server) list(r *request, q map[string][]string) (runtime.Object, error) {
	match, err := selector(r.res, q)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	items, err := s.items(r.res, r.ns, match)
	if err != nil {
		return nil, err
	}
	list, err := scheme.Scheme.New(r.res.gvr.GroupVersion().WithKind(r.res.kind + "List"))
	if err != nil {
		return nil, err
	}
	if err := meta.SetList(list, items); err != nil {
		return nil, err
	}
	lm, _ := meta.ListAccessor(list)
	lm.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	return list, nil
}

func (s *Server) create(res *resource, ns string, obj runtime.Object) (runtime.Object, error) {
	m, _ := meta.Accessor(obj)
	gr := res.gvr.GroupResource()
	if res.namespaced {
		if ns == "" {
			return nil, apierrors.NewBadRequest("a " + res.kind + " is created in a namespace")
		}
		if m.GetNamespace() != "" && m.GetNamespace() != ns {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("the namespace of the provided object (%s) does not match the namespace sent on the request (%s)", m.GetNamespace(), ns))
		}
		m.SetNamespace(ns)
	} else if m.GetNamespace() != "" {
		return nil, apierrors.NewBadRequest("a " + res.kind + " has no namespace")
	}
	if m.GetResourceVersion() != "" {
		return nil, apierrors.NewBadRequest("resourceVersion should not be set on objects to be created")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.GetName() == "" {
		if m.GetGenerateName() == "" {
			return nil, apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: res.kind}, "", nil)
		}
		m.SetName(m.GetGenerateName() + rand.String(5))
	}
	m.SetUID(uuid.NewUUID())
	m.SetCreationTimestamp(metav1.Now())
	m.SetGeneration(1)
	m.SetDeletionTimestamp(nil)
	if c, ok := obj.(*resourceapi.ResourceClaim); ok {
		c.Status = resourceapi.ResourceClaimStatus{} // written through .../status only
	}
	s.rv++
	m.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	if err := s.tracker.Create(res.gvr, obj, m.GetNamespace()); err != nil {
		s.rv--
		return nil, err
	}
	s.broadcast(res, watch.Added, obj)
	return obj.DeepCopyObject(), nil
}

// update replaces an object (or, for .../status, its status), checking the
// resourceVersion the client read it at.
func (s *Server) update(r *request, obj runtime.Object) (runtime.Object, error) {
	m, _ := meta.Accessor(obj)
	if m.GetName() != r.name {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", m.GetName(), r.name))
	}
	if m.GetNamespace() != "" && m.GetNamespace() != r.ns {
		return nil, apierrors.NewBadRequest("the namespace of the object does not match the URL's")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replaceLocked(r, obj)
}

func (s *Server) replaceLocked(r *request, obj runtime.Object) (runtime.Object, error) {
	gr := r.res.gvr.GroupResource()
	old, err := s.tracker.Get(r.res.gvr, r.ns, r.name)
	if err != nil {
		return nil, err
	}
	m, _ := meta.Accessor(obj)
	om, _ := meta.Accessor(old)
	if rv := m.GetResourceVersion(); rv != "" && rv != om.GetResourceVersion() {
		return nil, apierrors.NewConflict(gr, r.name, fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
	}
	if m.GetUID() != "" && m.GetUID() != om.GetUID() {
		return nil, apierrors.NewConflict(gr, r.name, fmt.Errorf("Precondition failed: UID in object meta: %s, does not match the stored %s", m.GetUID(), om.GetUID()))
	}
	next := obj
	if r.subresource == "status" {
		// Only the status: spec and metadata stay as stored.
		next = old.DeepCopyObject()
		nc, oc := next.(*resourceapi.ResourceClaim), obj.(*resourceapi.ResourceClaim)
		nc.Status = oc.Status
	} else {
		m.SetUID(om.GetUID())
		m.SetCreationTimestamp(om.GetCreationTimestamp())
		m.SetDeletionTimestamp(om.GetDeletionTimestamp())
		m.SetGeneration(om.GetGeneration())
		if c, ok := obj.(*resourceapi.ResourceClaim); ok {
			oc := old.(*resourceapi.ResourceClaim)
			c.Status = oc.Status // the status is written through .../status only
			if !equality.Semantic.DeepEqual(c.Spec, oc.Spec) {
				return nil, apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: r.res.kind}, r.name, nil)
			}
		}
		if sl, ok := obj.(*resourceapi.ResourceSlice); ok && !equality.Semantic.DeepEqual(sl.Spec, old.(*resourceapi.ResourceSlice).Spec) {
			m.SetGeneration(om.GetGeneration() + 1)
		}
	}
	nm, _ := meta.Accessor(next)
	if nm.GetDeletionTimestamp() != nil && len(nm.GetFinalizers()) == 0 {
		return next, s.removeLocked(r.res, r.ns, r.name, next)
	}
	s.rv++
	nm.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	if err := s.tracker.Update(r.res.gvr, next, r.ns); err != nil {
		s.rv--
		return nil, err
	}
	s.broadcast(r.res, watch.Modified, next)
	return next.DeepCopyObject(), nil
}

// patch applies a JSON merge patch or a strategic merge patch to the
// stored object; the result is decoded strictly, then updated as a PUT.
func (s *Server) patch(w http.ResponseWriter, hr *http.Request, r *request) (runtime.Object, error, bool) {
	body, ok := s.readBody(w, hr, string(types.MergePatchType), string(types.StrategicMergePatchType))
	if !ok {
		return nil, nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.tracker.Get(r.res.gvr, r.ns, r.name)
	if err != nil {
		return nil, err, true
	}
	old.GetObjectKind().SetGroupVersionKind(r.res.gvr.GroupVersion().WithKind(r.res.kind))
	oldJSON, err := json.Marshal(old)
	if err != nil {
		return nil, err, true
	}
	var merged []byte
	if strings.HasPrefix(hr.Header.Get("Content-Type"), string(types.StrategicMergePatchType)) {
		merged, err = strategicpatch.StrategicMergePatch(oldJSON, body, r.res.newObj())
	} else {
		merged, err = jsonpatch.MergePatch(oldJSON, body)
	}
	if err != nil {
		s.mu.Unlock()
		s.reject(w, hr, apierrors.NewBadRequest("the patch does not apply: "+err.Error()), "patch")
		s.mu.Lock()
		return nil, nil, false
	}
	obj, err := s.strict(merged, r.res)
	if err != nil {
		s.mu.Unlock()
		s.reject(w, hr, apierrors.NewBadRequest(err.Error()), "patched body")
		s.mu.Lock()
		return nil, nil, false
	}
	out, err := s.replaceLocked(r, obj)
	return out, err, true
}

func (s *Server) delete(res *resource, ns, name string, opts *metav1.DeleteOptions) (runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deleteLocked(res, ns, name, opts)
}

func (s *Server) deleteLocked(res *resource, ns, name string, opts *metav1.DeleteOptions) (runtime.Object, error) {
	gr := res.gvr.GroupResource()
	old, err := s.tracker.Get(res.gvr, ns, name)
	if err != nil {
		return nil, err
	}
	om, _ := meta.Accessor(old)
	if p := opts.Preconditions; p != nil {
		if p.UID != nil && *p.UID != om.GetUID() {
			return nil, apierrors.NewConflict(gr, name, fmt.Errorf("Precondition failed: UID in precondition: %s, UID in object meta: %s", *p.UID, om.GetUID()))
		}
		if p.ResourceVersion != nil && *p.ResourceVersion != om.GetResourceVersion() {
			return nil, apierrors.NewConflict(gr, name, fmt.Errorf("Precondition failed: ResourceVersion in precondition: %s, ResourceVersion in object meta: %s", *p.ResourceVersion, om.GetResourceVersion()))
		}
	}
	if len(om.GetFinalizers()) > 0 {
		// Marked for deletion; gone once its finalizers are removed.
		if om.GetDeletionTimestamp() == nil {
			now := metav1.Now()
			om.SetDeletionTimestamp(&now)
			s.rv++
			om.SetResourceVersion(strconv.FormatInt(s.rv, 10))
			if err := s.tracker.Update(res.gvr, old, ns); err != nil {
				return nil, err
			}
			s.broadcast(res, watch.Modified, old)
		}
		return old.DeepCopyObject(), nil
	}
	return old, s.removeLocked(res, ns, name, old)
}

func (s *Server) removeLocked(res *resource, ns, name string, last runtime.Object) error {
	if err := s.tracker.Delete(res.gvr, ns, name); err != nil {
		return err
	}
	s.rv++
	m, _ := meta.Accessor(last)
	m.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	s.broadcast(res, watch.Deleted, last)
	return nil
}

func (s *Server) deleteCollection(r *request, q map[string][]string, opts *metav1.DeleteOptions) (runtime.Object, error) {
	match, err := selector(r.res, q)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	items, err := s.items(r.res, r.ns, match)
	if err != nil {
		return nil, err
	}
	for _, o := range items {
		m, _ := meta.Accessor(o)
		if _, err := s.deleteLocked(r.res, m.GetNamespace(), m.GetName(), opts); err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	return &metav1.Status{Status: metav1.StatusSuccess}, nil
}

// ------------------------------------------------------------ watch

// broadcast fans an event out to the matching watches (s.mu held).
func (s *Server) broadcast(res *resource, typ watch.EventType, obj runtime.Object) {
	m, _ := meta.Accessor(obj)
	for w := range s.watchers {
		if w.res != res || w.closed || (w.ns != "" && w.ns != m.GetNamespace()) || !w.sel(obj) {
			continue
		}
		select {
		case w.events <- watch.Event{Type: typ, Object: obj.DeepCopyObject()}:
		default:
			w.closed = true
			close(w.events)
		}
	}
}

func (s *Server) watch(w http.ResponseWriter, hr *http.Request, r *request) {
	q := hr.URL.Query()
	match, err := selector(r.res, q)
	if err != nil {
		writeStatus(w, err)
		return
	}
	if r.name != "" {
		writeStatus(w, apierrors.NewBadRequest("watch a collection"))
		return
	}
	var from int64
	if v := q.Get("resourceVersion"); v != "" {
		if from, err = strconv.ParseInt(v, 10, 64); err != nil {
			writeStatus(w, apierrors.NewBadRequest("resourceVersion: "+err.Error()))
			return
		}
	}
	initialEvents := q.Get("sendInitialEvents") == "true"
	if initialEvents && q.Get("resourceVersionMatch") != string(metav1.ResourceVersionMatchNotOlderThan) {
		writeStatus(w, apierrors.NewBadRequest("sendInitialEvents requires resourceVersionMatch=NotOlderThan"))
		return
	}
	timeout := 30 * time.Minute
	if v := q.Get("timeoutSeconds"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeStatus(w, apierrors.NewBadRequest("timeoutSeconds: "+v))
			return
		}
		if n > 0 {
			timeout = time.Duration(n) * time.Second
		}
	}
	// The stored state and the watch start at one point between writes.
	wt := &watcher{res: r.res, ns: r.ns, sel: match, events: make(chan watch.Event, MaxWatchBacklog)}
	s.mu.Lock()
	items, err := s.items(r.res, r.ns, match)
	var initial []watch.Event
	for _, o := range items {
		if initialEvents || from == 0 || rvOf(o) > from {
			initial = append(initial, watch.Event{Type: watch.Added, Object: o})
		}
	}
	bookmarkRV := s.rv
	s.watchers[wt] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, wt)
		s.mu.Unlock()
	}()
	if err != nil {
		writeStatus(w, err)
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush() // the headers: the client's Watch returns on them
	}
	enc := json.NewEncoder(w)
	send := func(ev watch.Event) bool {
		ev.Object.GetObjectKind().SetGroupVersionKind(r.res.gvr.GroupVersion().WithKind(r.res.kind))
		raw, err := json.Marshal(ev.Object)
		if err != nil {
			return false
		}
		if err := enc.Encode(metav1.WatchEvent{Type: string(ev.Type), Object: runtime.RawExtension{Raw: raw}}); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	for _, ev := range initial {
		if !send(ev) {
			return
		}
	}
	if initialEvents {
		bm := r.res.newObj()
		m, _ := meta.Accessor(bm)
		m.SetResourceVersion(strconv.FormatInt(bookmarkRV, 10))
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		if !send(watch.Event{Type: watch.Bookmark, Object: bm}) {
			return
		}
	}
	ctx, cancel := context.WithTimeout(hr.Context(), timeout)
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case ev, ok := <-wt.events:
			if !ok {
				return // overflowed: the client watches again
			}
			if !send(ev) {
				return
			}
		}
	}
}

// ------------------------------------------------------------ answers

func writeObject(w http.ResponseWriter, code int, obj runtime.Object) {
	if gvks, _, err := scheme.Scheme.ObjectKinds(obj); err == nil && len(gvks) > 0 {
		obj.GetObjectKind().SetGroupVersionKind(gvks[0])
	}
	if _, ok := obj.(*metav1.Status); ok {
		obj.GetObjectKind().SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("Status"))
	}
	data, err := json.Marshal(obj)
	if err != nil {
		writeStatus(w, err)
		return
	}
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	w.WriteHeader(code)
	_, _ = w.Write(data)
}

func writeStatus(w http.ResponseWriter, err error) {
	st := apierrors.APIStatus(nil)
	if as, ok := err.(apierrors.APIStatus); ok {
		st = as
	} else {
		st = apierrors.NewInternalError(err)
	}
	status := st.Status()
	status.Kind, status.APIVersion = "Status", "v1"
	data, _ := json.Marshal(status)
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	code := int(status.Code)
	if code == 0 {
		code = http.StatusInternalServerError
	}
	w.WriteHeader(code)
	_, _ = w.Write(data)
}
