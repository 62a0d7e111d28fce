package api

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TLSFiles names the PEM files of a TLS server: its certificate chain and
// key, and optionally the CA bundle that client certificates must chain to
// (mutual TLS: a client without a valid certificate is refused in the
// handshake).
type TLSFiles struct {
	CertFile, KeyFile string
	ClientCAFile      string
}

// TLSReloader serves the certificate of TLSFiles and picks up new files
// without a restart (cert-manager and Kubernetes secrets rotate them in
// place): at most once per checkEvery, a handshake looks at the files' size
// and modification time and reloads them when they changed. A reload that
// fails (half-written pair, bad PEM) keeps the previous certificate and is
// logged and counted.
type TLSReloader struct {
	files   TLSFiles
	log     *slog.Logger
	metrics *tlsMetrics

	mu        sync.Mutex
	cur       *tls.Config // the per-handshake template, replaced on reload
	stamps    [3]fileStamp
	lastCheck time.Time
}

// tlsCheckEvery bounds how often handshakes look at the files.
const tlsCheckEvery = 5 * time.Second

type tlsMetrics struct {
	reloads *prometheus.CounterVec
	expiry  prometheus.Gauge
}

// NewTLSReloader loads the files once (an error is fatal at start) and
// registers kvindexd_tls_reloads_total{result} and
// kvindexd_tls_cert_expiry_timestamp_seconds on reg (nil = none). name
// labels the server ("grpc", "http").
func NewTLSReloader(name string, files TLSFiles, reg *prometheus.Registry, log *slog.Logger) (*TLSReloader, error) {
	if files.CertFile == "" || files.KeyFile == "" {
		return nil, errors.New("TLS needs both a certificate and a key file")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &TLSReloader{files: files, log: log, metrics: &tlsMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_tls_reloads_total", Help: "TLS certificate reloads after the files changed, by result.",
			ConstLabels: prometheus.Labels{"server": name},
		}, []string{"result"}),
		expiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindexd_tls_cert_expiry_timestamp_seconds", Help: "NotAfter of the served certificate (Unix time).",
			ConstLabels: prometheus.Labels{"server": name},
		}),
	}}
	if err := r.load(); err != nil {
		return nil, err
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{r.metrics.reloads, r.metrics.expiry} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

func (r *TLSReloader) paths() []string {
	p := []string{r.files.CertFile, r.files.KeyFile}
	if r.files.ClientCAFile != "" {
		p = append(p, r.files.ClientCAFile)
	}
	return p
}

// load reads every file and replaces the template. Called with mu held or
// before r is shared.
func (r *TLSReloader) load() error {
	var stamps [3]fileStamp
	for i, p := range r.paths() {
		st, err := stampOf(p)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		stamps[i] = st
	}
	cert, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
	if err != nil {
		return fmt.Errorf("tls: certificate %s / key %s: %w", r.files.CertFile, r.files.KeyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if r.files.ClientCAFile != "" {
		pem, err := os.ReadFile(r.files.ClientCAFile)
		if err != nil {
			return fmt.Errorf("tls: client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tls: client CA %s: no PEM certificate in it", r.files.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	if leaf, err := x509.ParseCertificate(cert.Certificate[0]); err == nil && r.metrics != nil {
		r.metrics.expiry.Set(float64(leaf.NotAfter.Unix()))
	}
	r.cur, r.stamps, r.lastCheck = cfg, stamps, time.Now()
	return nil
}

// current returns the template, reloading it first when the files changed.
func (r *TLSReloader) current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.lastCheck) < tlsCheckEvery {
		return r.cur
	}
	r.lastCheck = time.Now()
	changed := false
	for i, p := range r.paths() {
		if st, err := stampOf(p); err != nil || st != r.stamps[i] {
			changed = true
		}
	}
	if !changed {
		return r.cur
	}
	if err := r.load(); err != nil {
		r.metrics.reloads.WithLabelValues("error").Inc()
		r.log.Error("TLS files changed but do not load; serving the previous certificate", "err", err)
		return r.cur
	}
	r.metrics.reloads.WithLabelValues("ok").Inc()
	r.log.Info("TLS certificate reloaded", "cert", r.files.CertFile)
	return r.cur
}

// ServerConfig is the tls.Config to serve with; nextProtos are the ALPN
// protocols ("h2" for gRPC; "h2", "http/1.1" for HTTP).
func (r *TLSReloader) ServerConfig(nextProtos ...string) *tls.Config {
	get := func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := r.current().Clone()
		c.NextProtos = nextProtos
		return c, nil
	}
	base, _ := get(nil)
	base.GetConfigForClient = get
	return base
}
