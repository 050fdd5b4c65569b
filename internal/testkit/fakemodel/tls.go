package fakemodel

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"time"
)

// TestCA is a throwaway certificate authority and one server certificate
// it signed, for running the fake model over TLS (ServeTLS). The model
// route verifies the provider's certificate against the system trust
// store in production; tests hand the launcher Roots instead (its test
// knob), so nothing in the sandbox or the host's store trusts this CA.
type TestCA struct {
	// Cert is the server certificate for the names given to NewTestCA.
	Cert tls.Certificate
	// Roots holds the CA alone; PEM is the CA certificate encoded.
	Roots *x509.CertPool
	PEM   []byte
}

// NewTestCA makes a CA valid for a day and a server certificate for names
// (DNS names; each may also be an IP address literal).
func NewTestCA(names ...string) (*TestCA, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "paseo-policy fake model test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	// RSA for the server's own key: busybox's TLS client (an agent's
	// wget in the tests) speaks no ECDSA.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, n := range names {
		if ip := parseIP(n); ip != nil {
			leaf.IPAddresses = append(leaf.IPAddresses, ip)
		} else {
			leaf.DNSNames = append(leaf.DNSNames, n)
		}
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return &TestCA{Cert: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}, Roots: roots,
		PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}, nil
}

func parseIP(s string) net.IP { return net.ParseIP(s) }
