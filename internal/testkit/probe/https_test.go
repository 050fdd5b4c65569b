package probe

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// allowed-https verifies TLS against the given CA for the URL's host name,
// and fails with the wrong CA; the test server is the test's own, on
// loopback.
func TestAllowedHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(srv.URL, "https://")
	// httptest's certificate names example.com.
	got := allowedHTTPS(context.Background(), "https://example.com/v1/models", ca, addr)
	if got.verdict != Reachable || !strings.Contains(got.evidence, "HTTPS 204") {
		t.Fatalf("allowed-https: %+v", got)
	}
	// A self-signed certificate of another key for the same name: the
	// server's certificate does not chain to it.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "other CA"}, DNSNames: []string{"example.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(dir, "wrong.pem")
	_ = os.WriteFile(wrong, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	if got := allowedHTTPS(context.Background(), "https://example.com/", wrong, addr); got.verdict != Unreachable {
		t.Fatalf("with the wrong CA: %+v", got)
	}
	if got := allowedHTTPS(context.Background(), "", ca, addr); got.verdict != Inconclusive {
		t.Fatalf("unconfigured: %+v", got)
	}
}
