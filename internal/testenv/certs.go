package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs is a throwaway CA and certificates it signed, as PEM files, for
// tests of TLS against real servers.
type Certs struct {
	Dir    string
	CAFile string // the CA certificate
	// ServerCert and ServerKey are for 127.0.0.1 and localhost.
	ServerCert, ServerKey string
	// ClientCert and ClientKey have the common name "cdc" (a Postgres role
	// for cert authentication).
	ClientCert, ClientKey string
	// ServerPEM is ServerKey and ServerCert in one file, as Kafka's PEM
	// keystore wants them.
	ServerPEM string

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// NewCerts makes a CA, a server certificate and a client certificate in a
// new temporary directory. The files are readable by their owner only, as
// Postgres requires of its key.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	dir := t.TempDir()
	c := &Certs{Dir: dir}
	var err error
	if c.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox-cdc test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &c.caKey.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if c.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	c.CAFile = writePEM(t, dir, "ca.pem", "CERTIFICATE", der)
	c.ServerCert, c.ServerKey = c.issue(t, "server", "localhost", x509.ExtKeyUsageServerAuth)
	c.ClientCert, c.ClientKey = c.issue(t, "client", "cdc", x509.ExtKeyUsageClientAuth)
	key, _ := os.ReadFile(c.ServerKey)
	cert, _ := os.ReadFile(c.ServerCert)
	c.ServerPEM = filepath.Join(dir, "server-keystore.pem")
	if err := os.WriteFile(c.ServerPEM, append(key, cert...), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

var serial int64 = 1

func (c *Certs) issue(t testing.TB, name, cn string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &key.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, c.Dir, name+".pem", "CERTIFICATE", der), writePEM(t, c.Dir, name+"-key.pem", "PRIVATE KEY", pk)
}

// ServerTLS is a tls.Config that serves the server certificate.
func (c *Certs) ServerTLS(t testing.TB) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
