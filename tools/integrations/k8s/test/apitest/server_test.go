package apitest

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

func clientset(t *testing.T, s *Server) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func post(t *testing.T, url, ct, body string) int {
	t.Helper()
	resp, err := http.Post(url, ct, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A body with an unknown field, a duplicated field, a wrong type or the
// wrong kind is a 400 and is recorded (New fails the test on it); so is a
// body that is not JSON.
func TestRequestBodiesAreDecodedStrictly(t *testing.T) {
	s := NewServer()
	defer s.Close()
	claims := s.URL + "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
	bad := map[string]string{
		"unknown field":   `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"a"},"spec":{"devices":{"requestz":[]}}}`,
		"duplicate field": `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"a","name":"b"}}`,
		"wrong type":      `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"a"},"spec":{"devices":{"requests":"qpu"}}}`,
		"wrong kind":      `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"a"}}`,
	}
	for what, body := range bad {
		if code := post(t, claims, "application/json", body); code != http.StatusBadRequest {
			t.Errorf("%s: HTTP %d, want 400", what, code)
		}
	}
	if code := post(t, claims, "application/vnd.kubernetes.protobuf", "x"); code != http.StatusUnsupportedMediaType {
		t.Errorf("protobuf: HTTP %d, want 415", code)
	}
	if code := post(t, s.URL+"/apis/resource.k8s.io/v1beta1/resourceslices", "application/json", "{}"); code != http.StatusNotFound {
		t.Errorf("an unserved version: HTTP %d, want 404", code)
	}
	rej := s.Rejected()
	if len(rej) != len(bad)+2 {
		t.Fatalf("recorded %d refusals, want %d: %q", len(rej), len(bad)+2, rej)
	}
	for _, r := range rej {
		t.Log(r)
	}
	if !strings.Contains(strings.Join(rej, "\n"), `unknown field "spec.devices.requestz"`) {
		t.Errorf("the refusal does not name the unknown field: %q", rej)
	}
	// A well-formed body is taken.
	if code := post(t, claims, "application/json", `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"a"}}`); code != http.StatusCreated {
		t.Errorf("a good claim: HTTP %d", code)
	}
}

// What the driver relies on of an API server, through a real clientset:
// server-set metadata, the status subresource, resourceVersion conflicts,
// delete preconditions, selectors and watches.
func TestTheClientsetSeesAnAPIServersSemantics(t *testing.T) {
	s := New(t)
	kube := clientset(t, s)
	ctx := context.Background()
	claims := kube.ResourceV1().ResourceClaims("team-a")

	w, err := claims.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	in := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", UID: "client-set"},
		Status: resourceapi.ResourceClaimStatus{ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "u"}}}}
	c, err := claims.Create(ctx, in, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.UID == "" || c.UID == "client-set" || c.ResourceVersion == "" || c.CreationTimestamp.IsZero() || c.Generation != 1 {
		t.Errorf("server-set metadata: %+v", c.ObjectMeta)
	}
	if len(c.Status.ReservedFor) != 0 {
		t.Errorf("the status was kept on create: %+v", c.Status)
	}
	// The status is written through .../status, at the version read.
	c.Status.ReservedFor = in.Status.ReservedFor
	up, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(up.Status.ReservedFor) != 1 || up.ResourceVersion == c.ResourceVersion {
		t.Errorf("after UpdateStatus: rv %s -> %s, status %+v", c.ResourceVersion, up.ResourceVersion, up.Status)
	}
	if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("UpdateStatus at a stale resourceVersion: %v, want a conflict", err)
	}
	// A plain update does not touch the status.
	up.Labels = map[string]string{"a": "b"}
	up.Status = resourceapi.ResourceClaimStatus{}
	up2, err := claims.Update(ctx, up, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(up2.Status.ReservedFor) != 1 {
		t.Errorf("Update changed the status: %+v", up2.Status)
	}
	// Patch (merge) is decoded strictly too.
	if _, err := claims.Patch(ctx, "c", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("merge patch: %v", err)
	}
	got, err := claims.List(ctx, metav1.ListOptions{LabelSelector: "x=y"})
	if err != nil || len(got.Items) != 1 {
		t.Errorf("list by label: %v %v", got, err)
	}
	if got, err := claims.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=other"}); err != nil || len(got.Items) != 0 {
		t.Errorf("list by field: %v %v", got, err)
	}
	if _, err := claims.List(ctx, metav1.ListOptions{FieldSelector: "spec.nope=1"}); !apierrors.IsBadRequest(err) {
		t.Errorf("an unsupported field selector: %v, want 400", err)
	}
	// Delete with a stale precondition is a conflict; with the right one it goes.
	if err := claims.Delete(ctx, "c", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(types.UID("other"))}}); !apierrors.IsConflict(err) {
		t.Errorf("delete with another UID: %v", err)
	}
	if err := claims.Delete(ctx, "c", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID}}); err != nil {
		t.Fatal(err)
	}
	var seen []watch.EventType
	timeout := time.After(5 * time.Second)
	for len(seen) < 5 {
		select {
		case ev := <-w.ResultChan():
			seen = append(seen, ev.Type)
		case <-timeout:
			t.Fatalf("watch events: %v", seen)
		}
	}
	if want := []watch.EventType{watch.Added, watch.Modified, watch.Modified, watch.Modified, watch.Deleted}; !equal(seen, want) {
		t.Errorf("watch events %v, want %v", seen, want)
	}

	// Slices: generateName, and the field selectors the resourceslice
	// controller uses.
	slices := kube.ResourceV1().ResourceSlices()
	for _, node := range []string{"n1", "n2"} {
		sl := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "d", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
		got, err := slices.Create(ctx, sl, metav1.CreateOptions{})
		if err != nil || !strings.HasPrefix(got.Name, node+"-") || len(got.Name) != len(node)+6 {
			t.Fatalf("generateName: %v %v", got, err)
		}
	}
	l, err := slices.List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=d,spec.nodeName=n2"})
	if err != nil || len(l.Items) != 1 || *l.Items[0].Spec.NodeName != "n2" {
		t.Errorf("slices by node: %v %v", l, err)
	}
	if err := slices.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"}); err != nil {
		t.Fatal(err)
	}
	if l, _ := slices.List(ctx, metav1.ListOptions{}); len(l.Items) != 1 {
		t.Errorf("after deletecollection: %d slices", len(l.Items))
	}
	var buf bytes.Buffer
	for _, v := range []string{"create", "updateStatus", "update", "patch", "delete", "list", "watch"} {
		buf.WriteString(v + "=" + itoa(s.Count(v, "resourceclaims")) + " ")
	}
	t.Log("resourceclaims requests: ", buf.String())
}

func itoa(n int) string { return strconv.Itoa(n) }

func equal(a, b []watch.EventType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
