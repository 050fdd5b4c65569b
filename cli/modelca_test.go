package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// supervise --model-ca takes CA certificates and nothing else: a key, a
// file that is not PEM, or an empty one is a usage error, not ignored.
func TestReadModelCA(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test model CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	for name, tc := range map[string]struct {
		data string
		want string // "" accepted, else a part of the error
	}{
		"one":      {string(cert), ""},
		"two":      {string(cert) + string(cert), ""},
		"key too":  {string(cert) + string(keyPEM), "EC PRIVATE KEY block"},
		"not pem":  {"not a certificate\n", "not PEM"},
		"empty":    {"", "no certificate"},
		"trailing": {string(cert) + "junk", "not PEM after 1"},
		"bad der":  {string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("x")})), "--model-ca"},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "ca.pem")
			if err := os.WriteFile(p, []byte(tc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := readModelCA(p)
			switch {
			case tc.want == "" && (err != nil || string(got) != tc.data):
				t.Fatalf("refused a good file: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	if _, err := readModelCA(filepath.Join(t.TempDir(), "missing.pem")); err == nil {
		t.Fatal("a missing file was accepted")
	}
}
