package k8s

// The deploy manifests decode strictly (unknown or misspelt fields are
// errors) into the k8s.io/api types the API server would read them as.

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"sigs.k8s.io/yaml"

	qpuv1alpha1 "qrtd.io/tools/integrations/k8s/api/qpu.qrtd.io/v1alpha1"
	"qrtd.io/tools/integrations/k8s/internal/driver"
)

func TestDeployManifestsDecodeStrictlyIntoTheAPITypes(t *testing.T) {
	files, _ := filepath.Glob("deploy/*.yaml")
	if len(files) < 4 {
		t.Fatalf("deploy manifests: %v", files)
	}
	kinds := map[string]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			var obj any
			switch meta.Kind {
			case "Namespace":
				obj = &corev1.Namespace{}
			case "ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "Pod":
				obj = &corev1.Pod{}
			case "ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			case "Deployment":
				obj = &appsv1.Deployment{}
			case "PodGroup":
				obj = &schedulingv1beta1.PodGroup{}
			case "DaemonSet":
				obj = &appsv1.DaemonSet{}
			case "DeviceClass":
				obj = &resourceapi.DeviceClass{}
			case "ResourceClaimTemplate":
				obj = &resourceapi.ResourceClaimTemplate{}
			default:
				t.Fatalf("%s #%d: unexpected kind %q", f, i, meta.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Errorf("%s #%d (%s): %v", f, i, meta.Kind, err)
			}
			kinds[meta.Kind]++
			// The example's opaque parameters are what the driver accepts.
			if tmpl, ok := obj.(*resourceapi.ResourceClaimTemplate); ok {
				for _, c := range tmpl.Spec.Spec.Devices.Config {
					if c.Opaque == nil || c.Opaque.Driver != driver.DriverName {
						t.Errorf("%s: config for another driver: %+v", f, c)
						continue
					}
					js, err := yaml.YAMLToJSON(c.Opaque.Parameters.Raw)
					if err != nil {
						t.Fatal(err)
					}
					p, err := qpuv1alpha1.NewDecoder().Decode(js)
					if err != nil {
						t.Errorf("%s: example parameters: %v", f, err)
					} else if _, err := driver.Resolve(p, []string{"qpu0"}, timeNow()); err != nil {
						t.Errorf("%s: example parameters: %v", f, err)
					}
				}
			}
		}
	}
	for _, k := range []string{"DaemonSet", "Deployment", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "DeviceClass", "ResourceClaimTemplate", "Pod"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in deploy/", k)
		}
	}
}
