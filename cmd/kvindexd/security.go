package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/api"
)

// SecurityConfig is who may call the daemon, over what, and how much one
// client may hold. It is embedded in Config (same file keys, flags, env).
type SecurityConfig struct {
	TLSCertFile     string `json:"tls_cert_file" yaml:"tls_cert_file"`
	TLSKeyFile      string `json:"tls_key_file" yaml:"tls_key_file"`
	TLSClientCAFile string `json:"tls_client_ca_file" yaml:"tls_client_ca_file"`

	AuthTokenFile string `json:"auth_token_file" yaml:"auth_token_file"`
	MetricsAuth   bool   `json:"metrics_auth" yaml:"metrics_auth"`
	AdminAPI      bool   `json:"admin_api" yaml:"admin_api"`

	AllowedEndpointCIDRs []string `json:"allowed_endpoint_cidrs" yaml:"allowed_endpoint_cidrs"`

	HTTPReadHeaderTimeout Duration `json:"http_read_header_timeout" yaml:"http_read_header_timeout"`
	HTTPReadTimeout       Duration `json:"http_read_timeout" yaml:"http_read_timeout"`
	HTTPWriteTimeout      Duration `json:"http_write_timeout" yaml:"http_write_timeout"`
	HTTPIdleTimeout       Duration `json:"http_idle_timeout" yaml:"http_idle_timeout"`
	HTTPMaxHeaderBytes    int      `json:"http_max_header_bytes" yaml:"http_max_header_bytes"`
	HTTPHeaderBudget      int64    `json:"http_header_budget_bytes" yaml:"http_header_budget_bytes"`
	HTTPMaxBodyBytes      int64    `json:"http_max_body_bytes" yaml:"http_max_body_bytes"`
	HTTPBodyBudgetBytes   int64    `json:"http_body_budget_bytes" yaml:"http_body_budget_bytes"`
	HTTPMaxConns          int      `json:"http_max_conns" yaml:"http_max_conns"`
	GRPCMaxConns          int      `json:"grpc_max_conns" yaml:"grpc_max_conns"`
	GRPCIdleTimeout       Duration `json:"grpc_idle_timeout" yaml:"grpc_idle_timeout"`
	GRPCMaxStreams        int      `json:"grpc_max_streams" yaml:"grpc_max_streams"`
}

// defaultSecurity takes the limits' defaults from api.Options.
func defaultSecurity() SecurityConfig {
	o, l := &api.Options, api.DefaultHTTPLimits()
	return SecurityConfig{
		HTTPReadHeaderTimeout: Duration(l.ReadHeaderTimeout),
		HTTPReadTimeout:       Duration(l.ReadTimeout),
		HTTPWriteTimeout:      Duration(l.WriteTimeout),
		HTTPIdleTimeout:       Duration(l.IdleTimeout),
		HTTPMaxHeaderBytes:    l.MaxHeaderBytes,
		HTTPHeaderBudget:      l.HeaderBudget,
		HTTPMaxBodyBytes:      o.MaxBodyBytes.Default,
		HTTPBodyBudgetBytes:   o.BodyBudget.Default,
		HTTPMaxConns:          int(o.HTTPMaxConns.Default),
		GRPCMaxConns:          int(o.GRPCMaxConns.Default),
		GRPCIdleTimeout:       Duration(o.GRPCIdleTimeout.Default),
		GRPCMaxStreams:        int(o.GRPCMaxStreams.Default),
	}
}

func securityFlags(fs *flag.FlagSet, c *SecurityConfig) {
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", c.TLSCertFile, "PEM certificate chain served on gRPC and HTTP (with --tls-key-file; reloaded when the file changes)")
	fs.StringVar(&c.TLSKeyFile, "tls-key-file", c.TLSKeyFile, "PEM private key of --tls-cert-file")
	fs.StringVar(&c.TLSClientCAFile, "tls-client-ca-file", c.TLSClientCAFile, "PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
	fs.StringVar(&c.AuthTokenFile, "auth-token-file", c.AuthTokenFile, "bearer tokens, one \"<token> <read|admin>\" per line; every call but the probes and the status page itself then needs one (the page asks for a token)")
	fs.BoolVar(&c.MetricsAuth, "metrics-auth", c.MetricsAuth, "with --auth-token-file: /metrics needs a read token too")
	fs.BoolVar(&c.AdminAPI, "admin-api", c.AdminAPI, "serve POST/DELETE /v1/endpoints (AddEndpoint, RemoveEndpoint); also on when the token file has an admin token")
	fs.Var(listFlag{&c.AllowedEndpointCIDRs}, "allowed-endpoint-cidrs", "engine addresses the daemon may connect to (--endpoint, POST /v1/endpoints, replay), comma-separated CIDRs; empty = any")
	o := &api.Options
	durationOpt(fs, &c.HTTPReadHeaderTimeout, o.ReadHeaderTimeout)
	durationOpt(fs, &c.HTTPReadTimeout, o.ReadTimeout)
	durationOpt(fs, &c.HTTPWriteTimeout, o.WriteTimeout)
	durationOpt(fs, &c.HTTPIdleTimeout, o.IdleTimeout)
	intOpt(fs, &c.HTTPMaxHeaderBytes, o.MaxHeaderBytes)
	int64Opt(fs, &c.HTTPHeaderBudget, o.HeaderBudget)
	int64Opt(fs, &c.HTTPMaxBodyBytes, o.MaxBodyBytes)
	int64Opt(fs, &c.HTTPBodyBudgetBytes, o.BodyBudget)
	intOpt(fs, &c.HTTPMaxConns, o.HTTPMaxConns)
	intOpt(fs, &c.GRPCMaxConns, o.GRPCMaxConns)
	durationOpt(fs, &c.GRPCIdleTimeout, o.GRPCIdleTimeout)
	intOpt(fs, &c.GRPCMaxStreams, o.GRPCMaxStreams)
}

func (c *SecurityConfig) validateSecurity() error {
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("--tls-cert-file and --tls-key-file go together")
	}
	if c.TLSClientCAFile != "" && c.TLSCertFile == "" {
		return errors.New("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
	}
	if c.MetricsAuth && c.AuthTokenFile == "" {
		return errors.New("--metrics-auth needs --auth-token-file")
	}
	if _, err := api.ParseCIDRs(c.AllowedEndpointCIDRs); err != nil {
		return fmt.Errorf("--allowed-endpoint-cidrs: %w", err)
	}
	return nil
}

func (c *SecurityConfig) httpLimits() api.HTTPLimits {
	return api.HTTPLimits{ReadHeaderTimeout: time.Duration(c.HTTPReadHeaderTimeout), ReadTimeout: time.Duration(c.HTTPReadTimeout),
		WriteTimeout: time.Duration(c.HTTPWriteTimeout), IdleTimeout: time.Duration(c.HTTPIdleTimeout), MaxHeaderBytes: c.HTTPMaxHeaderBytes,
		HeaderBudget: c.HTTPHeaderBudget}
}

// security is what the daemon built from SecurityConfig.
type security struct {
	tokens *api.Tokens
	policy *api.EndpointPolicy
	// grpcTLS and httpTLS are nil without --tls-cert-file.
	grpcTLS, httpTLS *api.TLSReloader
	conns            *api.ConnMetrics
}

// tokenReloadEvery is how often the token file is looked at.
const tokenReloadEvery = 5 * time.Second

// buildSecurity loads the token file and certificates and checks the
// configured endpoints against the endpoint policy.
func buildSecurity(ctx context.Context, cfg Config, reg *prometheus.Registry, log *slog.Logger) (*security, error) {
	c := &cfg.SecurityConfig
	s := &security{policy: api.DefaultEndpointPolicy}
	var err error
	if len(c.AllowedEndpointCIDRs) > 0 {
		cidrs, err := api.ParseCIDRs(c.AllowedEndpointCIDRs)
		if err != nil {
			return nil, fmt.Errorf("--allowed-endpoint-cidrs: %w", err)
		}
		s.policy = &api.EndpointPolicy{AllowedCIDRs: cidrs}
	}
	for _, ep := range cfg.Endpoints {
		if err := s.policy.CheckEndpoint(ctx, ep.Address, ep.Replay, ep.Snapshot); err != nil {
			return nil, fmt.Errorf("--endpoint: %w", err)
		}
	}
	if c.AuthTokenFile != "" {
		if s.tokens, err = api.LoadTokens(c.AuthTokenFile, log.With("component", "auth")); err != nil {
			return nil, fmt.Errorf("--auth-token-file: %w", err)
		}
	}
	if c.TLSCertFile != "" {
		files := api.TLSFiles{CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, ClientCAFile: c.TLSClientCAFile}
		if s.grpcTLS, err = api.NewTLSReloader("grpc", files, reg, log.With("component", "tls")); err != nil {
			return nil, err
		}
		if s.httpTLS, err = api.NewTLSReloader("http", files, reg, log.With("component", "tls")); err != nil {
			return nil, err
		}
	}
	if s.conns, err = api.NewConnMetrics(reg); err != nil {
		return nil, err
	}
	return s, nil
}
