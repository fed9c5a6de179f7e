// Package deploytest reads rendered manifests back for the tests of
// deploy and of the tiers that run what deploy renders (test/e2e).
package deploytest

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy"
)

// RenderedPod renders p and returns the pod template of the workload (a
// Deployment, StatefulSet, DaemonSet or CronJob) named name; kind, when set, must
// match too. The test fails when none is rendered.
func RenderedPod(t testing.TB, p deploy.Params, kind, name string) corev1.PodSpec {
	t.Helper()
	return RenderedPodValues(t, p, nil, kind, name)
}

// RenderedPodValues is RenderedPod with extra chart values laid over p's
// (a --values file's content).
func RenderedPodValues(t testing.TB, p deploy.Params, extra map[string]any, kind, name string) corev1.PodSpec {
	t.Helper()
	out, err := deploy.RenderValues(p, extra)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := Documents(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docs {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		if head.Metadata.Name != name || kind != "" && head.Kind != kind {
			continue
		}
		switch head.Kind {
		case "Deployment":
			var d appsv1.Deployment
			if err := yaml.UnmarshalStrict(doc, &d); err != nil {
				t.Fatal(err)
			}
			return d.Spec.Template.Spec
		case "StatefulSet":
			var s appsv1.StatefulSet
			if err := yaml.UnmarshalStrict(doc, &s); err != nil {
				t.Fatal(err)
			}
			return s.Spec.Template.Spec
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := yaml.UnmarshalStrict(doc, &ds); err != nil {
				t.Fatal(err)
			}
			return ds.Spec.Template.Spec
		case "CronJob":
			var cj batchv1.CronJob
			if err := yaml.UnmarshalStrict(doc, &cj); err != nil {
				t.Fatal(err)
			}
			return cj.Spec.JobTemplate.Spec.Template.Spec
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return corev1.PodSpec{}
}

// Documents splits a multi-document YAML stream, as manifests and helm
// template print it, into its documents, leaving out the empty ones (a
// separator alone, or helm's "# Source:" comment alone).
func Documents(stream []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var out [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("deploytest: document %d: %w", len(out)+1, err)
		}
		var v any
		if err := yaml.Unmarshal(doc, &v); err != nil {
			return nil, fmt.Errorf("deploytest: document %d: %w", len(out)+1, err)
		}
		if v != nil {
			out = append(out, doc)
		}
	}
}

// CAPEM is a fresh self-signed CA certificate in PEM, for a CA bundle.
func CAPEM(t testing.TB) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "compass test CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
