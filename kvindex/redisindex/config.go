package redisindex

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/kvindex"
	"github.com/redis/go-redis/v9"
)

// Defaults for Config fields left zero.
const (
	DefaultNamespace    = "kvindex"
	DefaultTTL          = 24 * time.Hour
	DefaultDialTimeout  = time.Second
	DefaultIOTimeout    = time.Second
	DefaultStatsRefresh = 5 * time.Second
	DefaultCallTimeout  = time.Second
	DefaultLossCheck    = time.Second
)

// go-redis dials 5 times 100ms apart by default before a command fails; a
// Redis that refuses connections should surface as Unavailable quickly.
const (
	dialerRetries   = 2
	dialerRetryWait = 50 * time.Millisecond
)

// Config configures the Redis index.
type Config struct {
	// URL selects the server(s):
	//   redis://[[user]:password@]host:port[/db][?options]     single node
	//   rediss://...                                            single node over TLS
	//   redis-cluster://[[user]:password@]h1:p1,h2:p2[?options] Redis Cluster (seed nodes)
	//   rediss-cluster://...                                    Redis Cluster over TLS
	// Options understood for every form: namespace, ttl (Go duration),
	// server_walk=true (single node, see ServerWalk), call_timeout (see
	// CallTimeout), loss_check (see LossCheck; 0 = never),
	// dial_timeout, read_timeout, write_timeout, pool_size, tls=true,
	// insecure_skip_verify=true, server_name. Single-node URLs also accept
	// every option go-redis ParseURL knows. Ranges (checkRanges,
	// checkDurations): pool_size 0..MaxPoolSize, max_retries and
	// max_redirects -1..100, timeouts and call_timeout 0..MaxIOTimeout,
	// loss_check 0 or MinLossCheck..MaxLossCheck.
	URL string
	// Namespace prefixes every key this index touches (several deployments can
	// share one Redis). Must not contain '{' or '}' (Cluster hash tags).
	// Default "kvindex"; overrides the URL's namespace option when set.
	Namespace string
	// TTL is the safety-net expiry of a block key, refreshed whenever a pod
	// adds that block. 0 = DefaultTTL; negative = no TTL. Overrides the URL's
	// ttl option when set.
	TTL time.Duration
	// Interner maps the pod and model names stored in Redis to the process'
	// PodID/ModelID. Required: it must be the interner of the indexer.Indexer
	// the index serves, which hands it to its backend factory.
	Interner *kvindex.Interner
	// DialTimeout, ReadTimeout, WriteTimeout bound each network operation so
	// a lost Redis surfaces as an error quickly (default 1s each).
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// CallTimeout bounds each index operation as a whole, every round
	// trip and retry of it (a lookup, a coalesced write flush, a clear, a
	// health check), whatever the caller's context allows: a node that
	// hangs with its connections open (SIGSTOP, DEBUG SLEEP, a failover in
	// progress) fails the call with ErrUnavailable after this long instead
	// of holding it for ReadTimeout per attempt; a node that keeps not
	// answering is then failed at once (guard.go). Default 1s (0);
	// 0..MaxIOTimeout. Overrides the URL's call_timeout option when set.
	CallTimeout time.Duration
	// LossCheck is how often the index checks whether Redis lost entries
	// (restarted, evicted, flushed; loss.go). Default 1s (0); negative =
	// never; otherwise MinLossCheck..MaxLossCheck. Overrides the URL's
	// loss_check option when set (loss_check=0 in a URL: never).
	LossCheck time.Duration
	// MaxRetries for one command on network errors (go-redis semantics;
	// 0 = 1 retry, -1 = none).
	MaxRetries int
	// PoolSize per node (0 = go-redis default, 10 per CPU).
	PoolSize int
	// TLS overrides the TLS configuration derived from the URL.
	TLS *tls.Config
	// StatsRefresh is how often Stats() counters and the pod epochs are
	// refreshed from Redis in the background (default 5s).
	StatsRefresh time.Duration
	// ServerWalk (single node only; ignored on Cluster, URL option
	// server_walk=true) makes lookups one Lua script that walks the keys on
	// the server and stops reading at the first miss, instead of one MGET
	// of every key. Since block values are packed strings read by one MGET
	// it costs more CPU in both cases measured on a 512-key, 8-pod prompt
	// (all warm, and mostly new), and the script blocks Redis for its whole
	// walk. Off by default.
	ServerWalk bool
	// CleanupQueue bounds the queue of stale entries waiting for lazy
	// deletion (default 65536); when full, stale entries are left for a later
	// read or for the TTL.
	CleanupQueue int
	// Logger receives the index's few log lines (the warning that TTL
	// expirations cannot be counted because keyspace notifications are off).
	// Default slog.Default().
	Logger *slog.Logger
	// NodeHook, when set, is called once per node client (every Cluster
	// node as it is created) with the node's address; a non-nil hook it
	// returns is installed on that node (the daemon's tracing: a span per
	// round trip).
	NodeHook func(addr string) redis.Hook
}

// ErrUnavailable is wrapped by every error caused by Redis being unreachable
// or failing; the indexer answers a score with it as Unavailable, which the
// api maps to gRPC Unavailable / HTTP 503.
var ErrUnavailable = errors.New("redis index unavailable")

type unavailableError struct {
	op  string
	err error
}

func (e *unavailableError) Error() string {
	return "redisindex: " + e.op + ": redis unavailable: " + e.err.Error()
}
func (e *unavailableError) Unwrap() error        { return e.err }
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }
func unavailable(op string, err error) error     { return &unavailableError{op: op, err: err} }

// IndexFlag is the parsed value of the daemon's --index flag.
type IndexFlag struct {
	Memory bool   // "memory" (or empty): the in-process index
	Redis  Config // otherwise: URL, Namespace, TTL filled from the value
}

// ParseIndexFlag parses --index: "memory" (default for ""), or a redis://,
// rediss://, redis-cluster:// or rediss-cluster:// URL (see Config.URL). The
// URL is validated completely (scheme, hosts, options) so a typo fails at
// startup rather than as a never-healthy index.
func ParseIndexFlag(v string) (IndexFlag, error) {
	v = strings.TrimSpace(v)
	if v == "" || strings.EqualFold(v, "memory") {
		return IndexFlag{Memory: true}, nil
	}
	cfg := Config{URL: v}
	if _, err := cfg.universalOptions(); err != nil {
		return IndexFlag{}, fmt.Errorf("--index %q: %w", redactURL(v), err)
	}
	return IndexFlag{Redis: cfg}, nil
}

// redactURL hides a password in error messages.
func redactURL(v string) string {
	if u, err := url.Parse(v); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	if i := strings.Index(v, "@"); i >= 0 {
		if j := strings.Index(v, "://"); j >= 0 && j < i {
			return v[:j+3] + "xxxxx" + v[i:]
		}
	}
	return v
}

func splitScheme(raw string) (cluster bool, tlsOn bool, err error) {
	switch {
	case strings.HasPrefix(raw, "redis://"):
		return false, false, nil
	case strings.HasPrefix(raw, "rediss://"):
		return false, true, nil
	case strings.HasPrefix(raw, "redis-cluster://"):
		return true, false, nil
	case strings.HasPrefix(raw, "rediss-cluster://"):
		return true, true, nil
	}
	return false, false, fmt.Errorf("unsupported index URL scheme (want memory, redis://, rediss://, redis-cluster:// or rediss-cluster://)")
}

// options is the client configuration derived from Config.
type options struct {
	cluster    bool
	single     *redis.Options
	clusterOp  *redis.ClusterOptions
	namespace  string
	ttl        time.Duration
	serverWalk bool
	// the Config fields CallTimeout and LossCheck, from the URL unless set
	callTimeout, lossCheck time.Duration
}

// ourOptions are consumed here and removed before go-redis sees the URL.
var ourOptions = []string{"namespace", "ttl", "tls", "insecure_skip_verify", "server_name", "server_walk", "call_timeout", "loss_check"}

// universalOptions turns the Config (URL and fields) into client options.
// Its errors never contain the URL's password: the parsers it calls (net/url
// in particular) quote the URL they failed on.
func (c *Config) universalOptions() (*options, error) {
	o, err := c.parseOptions()
	if err != nil {
		return nil, scrubPassword(c.URL, err)
	}
	return o, nil
}

func (c *Config) parseOptions() (*options, error) {
	cluster, tlsOn, err := splitScheme(c.URL)
	if err != nil {
		return nil, err
	}
	rest := c.URL[strings.Index(c.URL, "://")+3:]
	var query string
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		rest, query = rest[:i], rest[i+1:]
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("bad query: %w", err)
	}
	o := &options{cluster: cluster}
	if err := c.indexOptions(o, q); err != nil {
		return nil, err
	}
	tlsCfg, err := c.tlsConfig(tlsOn, q)
	if err != nil {
		return nil, err
	}
	for _, k := range ourOptions {
		q.Del(k)
	}
	com := c.connOptions(tlsCfg)
	if cluster {
		o.clusterOp, err = clusterOptions(rest, q, com)
	} else {
		o.single, err = singleOptions(rest, q, com)
	}
	if err != nil {
		return nil, err
	}
	return o, nil
}

// indexOptions reads the options that configure the index rather than the
// client (server_walk, namespace, ttl, call_timeout, loss_check), with the
// Config fields applied over them.
func (c *Config) indexOptions(o *options, q url.Values) error {
	if err := c.durationOptions(o, q); err != nil {
		return err
	}
	o.serverWalk = c.ServerWalk
	if v := q.Get("server_walk"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("server_walk: %w", err)
		}
		o.serverWalk = o.serverWalk || b
	}
	ns, ttl := DefaultNamespace, DefaultTTL
	if v := q.Get("namespace"); v != "" {
		ns = v
	}
	if s := q.Get("ttl"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("ttl: %w", err)
		}
		ttl = d
		if d == 0 {
			ttl = -1 // ttl=0 in a URL means no TTL
		}
	}
	var err error
	o.namespace, o.ttl, err = c.namespaceAndTTL(ns, ttl)
	return err
}

// durationOptions reads call_timeout and loss_check (a Go duration or a
// number of seconds, as the client's timeouts), the Config fields applied
// over them, and checks their ranges.
func (c *Config) durationOptions(o *options, q url.Values) error {
	o.callTimeout, o.lossCheck = c.CallTimeout, c.LossCheck
	if v := q.Get("call_timeout"); v != "" && o.callTimeout == 0 {
		d, err := parseDur(v)
		if err != nil {
			return fmt.Errorf("option call_timeout=%q: %w", v, err)
		}
		o.callTimeout = d
	}
	if v := q.Get("loss_check"); v != "" && o.lossCheck == 0 {
		d, err := parseDur(v)
		switch {
		case err != nil:
			return fmt.Errorf("option loss_check=%q: %w", v, err)
		case d < 0:
			return fmt.Errorf("option loss_check=%s: out of range (%s)", v, rangesDocument)
		case d == 0:
			d = -1 // loss_check=0 in a URL: never
		}
		o.lossCheck = d
	}
	return checkDurations(o.callTimeout, o.lossCheck)
}

// tlsConfig is the TLS configuration (nil: plain TCP): on when the scheme
// or tls=true says so, Config.TLS overriding whatever the URL says.
func (c *Config) tlsConfig(on bool, q url.Values) (*tls.Config, error) {
	cfg, err := urlTLS(on, q)
	if err != nil || c.TLS == nil {
		return cfg, err
	}
	return c.TLS, nil
}

// urlTLS is the TLS configuration the URL asks for (nil: none).
func urlTLS(on bool, q url.Values) (*tls.Config, error) {
	if v := q.Get("tls"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		on = on || b
	}
	if !on {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: q.Get("server_name")}
	if v := q.Get("insecure_skip_verify"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("insecure_skip_verify: %w", err)
		}
		cfg.InsecureSkipVerify = b
	}
	return cfg, nil
}

// connOpts are the client settings shared by both URL forms, before the
// URL's own options override them.
type connOpts struct {
	dial, read, write time.Duration
	maxRetries        int
	poolSize          int
	tls               *tls.Config
}

func (c *Config) connOptions(tlsCfg *tls.Config) connOpts {
	co := connOpts{
		dial: orDur(c.DialTimeout, DefaultDialTimeout), read: orDur(c.ReadTimeout, DefaultIOTimeout),
		write: orDur(c.WriteTimeout, DefaultIOTimeout), maxRetries: c.MaxRetries, poolSize: c.PoolSize, tls: tlsCfg,
	}
	if co.maxRetries == 0 {
		co.maxRetries = 1
	}
	return co
}

// singleOptions parses host:port[/db] and the go-redis options left in q;
// options the URL does not set come from com.
func singleOptions(rest string, q url.Values, com connOpts) (*redis.Options, error) {
	u := "redis://" + rest
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	so, err := redis.ParseURL(u)
	if err != nil {
		return nil, err
	}
	if rest == "" || strings.HasPrefix(rest, "/") || so.Addr == "" || strings.HasPrefix(so.Addr, ":") {
		return nil, fmt.Errorf("missing host:port")
	}
	if !q.Has("dial_timeout") {
		so.DialTimeout = com.dial
	}
	if !q.Has("read_timeout") {
		so.ReadTimeout = com.read
	}
	if !q.Has("write_timeout") {
		so.WriteTimeout = com.write
	}
	if !q.Has("max_retries") {
		so.MaxRetries = com.maxRetries
	}
	if com.poolSize > 0 {
		so.PoolSize = com.poolSize
	}
	if err := checkRanges(so.PoolSize, so.MaxRetries, 0, so.DialTimeout, so.ReadTimeout, so.WriteTimeout); err != nil {
		return nil, err
	}
	so.TLSConfig = com.tls
	// Network deadlines follow the call's context too (CallTimeout), not
	// only the per-attempt ReadTimeout/WriteTimeout.
	so.ContextTimeoutEnabled = true
	so.Protocol = 2
	so.DialerRetries, so.DialerRetryTimeout = dialerRetries, dialerRetryWait
	so.DisableIdentity = true
	return so, nil
}

// clusterOptions parses [user[:pass]@]h1:p1,h2:p2[/] and the options left
// in q (go-redis has no URL parser for Cluster).
func clusterOptions(rest string, q url.Values, com connOpts) (*redis.ClusterOptions, error) {
	co := &redis.ClusterOptions{
		DialTimeout: com.dial, ReadTimeout: com.read, WriteTimeout: com.write, MaxRetries: com.maxRetries,
	}
	var err error
	if co.Username, co.Password, rest, err = clusterUserinfo(rest); err != nil {
		return nil, err
	}
	if co.Addrs, err = clusterAddrs(rest); err != nil {
		return nil, err
	}
	for k, vs := range q {
		if err := setClusterOption(co, k, vs[len(vs)-1]); err != nil {
			return nil, err
		}
	}
	if com.poolSize > 0 {
		co.PoolSize = com.poolSize
	}
	if err := checkRanges(co.PoolSize, co.MaxRetries, co.MaxRedirects, co.DialTimeout, co.ReadTimeout, co.WriteTimeout); err != nil {
		return nil, err
	}
	co.TLSConfig = com.tls
	co.ContextTimeoutEnabled = true
	co.Protocol = 2
	co.DialerRetries, co.DialerRetryTimeout = dialerRetries, dialerRetryWait
	co.DisableIdentity = true
	return co, nil
}

// clusterUserinfo splits "[user[:pass]@]hosts" into its parts.
func clusterUserinfo(rest string) (user, pass, hosts string, err error) {
	i := strings.LastIndexByte(rest, '@')
	if i < 0 {
		return "", "", rest, nil
	}
	u, p, hasPass := strings.Cut(rest[:i], ":")
	if !hasPass {
		// redis-cluster://password@hosts is ambiguous; follow redis://
		// conventions: a lone userinfo is a user name.
		p = ""
	}
	if user, err = url.PathUnescape(u); err != nil {
		return "", "", "", fmt.Errorf("user: %w", err)
	}
	if pass, err = url.PathUnescape(p); err != nil {
		return "", "", "", errors.New("password: invalid %-escape")
	}
	return user, pass, rest[i+1:], nil
}

// clusterAddrs parses the comma-separated seed nodes.
func clusterAddrs(hosts string) ([]string, error) {
	hosts = strings.TrimSuffix(hosts, "/")
	if strings.Contains(hosts, "/") {
		return nil, fmt.Errorf("redis-cluster URLs take no database number (Cluster has only db 0)")
	}
	var addrs []string
	for _, a := range strings.Split(hosts, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		host, port, err := splitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("cluster node %q: %w", a, err)
		}
		addrs = append(addrs, host+":"+port)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("redis-cluster URL names no node")
	}
	return addrs, nil
}

// setClusterOption applies one URL option to a Cluster client.
func setClusterOption(co *redis.ClusterOptions, k, v string) error {
	var err error
	switch k {
	case "dial_timeout":
		co.DialTimeout, err = parseDur(v)
	case "read_timeout":
		co.ReadTimeout, err = parseDur(v)
	case "write_timeout":
		co.WriteTimeout, err = parseDur(v)
	case "pool_size":
		co.PoolSize, err = strconv.Atoi(v)
	case "max_retries":
		co.MaxRetries, err = strconv.Atoi(v)
	case "max_redirects":
		co.MaxRedirects, err = strconv.Atoi(v)
	default:
		err = fmt.Errorf("unknown option")
	}
	if err != nil {
		return fmt.Errorf("option %s=%q: %w", k, v, err)
	}
	return nil
}

// Ranges of the URL's numeric options (0 = go-redis's default for the
// counts). go-redis panics on a negative pool size and dials a huge pool up
// front; a negative timeout means none, and every Redis call needs one.
// A loss check runs INFO on every master: more often than MinLossCheck
// would load Redis for nothing, rarer than MaxLossCheck would leave a lost
// index unnoticed for longer than anyone would choose.
const (
	MaxPoolSize    = 10000
	MaxRetriesCap  = 100
	MaxRedirects   = 100
	MaxIOTimeout   = time.Minute
	MinLossCheck   = 100 * time.Millisecond
	MaxLossCheck   = time.Hour
	rangesDocument = "pool_size 0..10000, max_retries -1..100, max_redirects -1..100, dial/read/write_timeout and call_timeout 0..1m, loss_check 0 (never) or 100ms..1h"
)

// checkDurations checks CallTimeout and LossCheck (Config semantics: 0 =
// default, a negative LossCheck = never).
func checkDurations(call, loss time.Duration) error {
	if call < 0 || call > MaxIOTimeout {
		return fmt.Errorf("call_timeout %v: out of range (%s)", call, rangesDocument)
	}
	if loss > 0 && (loss < MinLossCheck || loss > MaxLossCheck) {
		return fmt.Errorf("loss_check %v: out of range (%s)", loss, rangesDocument)
	}
	return nil
}

func checkRanges(pool, retries, redirects int, timeouts ...time.Duration) error {
	switch {
	case pool < 0 || pool > MaxPoolSize:
		return fmt.Errorf("option pool_size=%d: out of range (%s)", pool, rangesDocument)
	case retries < -1 || retries > MaxRetriesCap:
		return fmt.Errorf("option max_retries=%d: out of range (%s)", retries, rangesDocument)
	case redirects < -1 || redirects > MaxRedirects:
		return fmt.Errorf("option max_redirects=%d: out of range (%s)", redirects, rangesDocument)
	}
	for _, t := range timeouts {
		if t < 0 || t > MaxIOTimeout {
			return fmt.Errorf("a timeout of %v: out of range (%s)", t, rangesDocument)
		}
	}
	return nil
}

// scrubPassword removes raw's password from err's message. Parsers quote
// the URL they fail on (net/url's *url.Error does), so their errors are
// reduced to the part that says what is wrong, and any remaining occurrence
// of the password, escaped or not, is masked.
func scrubPassword(raw string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	// An escape error quotes the bad escape, which may be part of the
	// password.
	var ee url.EscapeError
	if errors.As(err, &ee) {
		return errors.New("invalid %-escape in the URL")
	}
	pass := urlPassword(raw)
	if pass == "" {
		return err
	}
	msg := err.Error()
	masked := msg
	for _, p := range []string{pass, url.PathEscape(pass), url.QueryEscape(pass)} {
		masked = strings.ReplaceAll(masked, p, "xxxxx")
	}
	if unesc, uerr := url.PathUnescape(pass); uerr == nil && unesc != "" {
		masked = strings.ReplaceAll(masked, unesc, "xxxxx")
	}
	if masked == msg {
		return err
	}
	return errors.New(masked)
}

// urlPassword is the password part of raw's userinfo as written (not
// unescaped), found without a full parse: raw may be the malformed URL
// whose error is being scrubbed.
func urlPassword(raw string) string {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return ""
	}
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	_, pass, _ := strings.Cut(rest[:at], ":")
	return pass
}

// namespaceAndTTL applies the Config fields over the URL's (or the
// defaults') namespace and TTL and validates the namespace; New and
// NewWithClient share it so the two constructors cannot drift apart.
func (c *Config) namespaceAndTTL(ns string, ttl time.Duration) (string, time.Duration, error) {
	if c.Namespace != "" {
		ns = c.Namespace
	}
	if strings.ContainsAny(ns, "{}") {
		return "", 0, fmt.Errorf("namespace %q must not contain '{' or '}' (Redis Cluster hash tags)", ns)
	}
	if c.TTL != 0 {
		ttl = c.TTL
	}
	return ns, ttl, nil
}

func splitHostPort(a string) (string, string, error) {
	i := strings.LastIndexByte(a, ':')
	if i <= 0 || i == len(a)-1 {
		return "", "", fmt.Errorf("want host:port")
	}
	host, port := a[:i], a[i+1:]
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return "", "", fmt.Errorf("bad port %q", port)
	}
	return host, port, nil
}

// parseDur accepts a Go duration or a plain number of seconds (go-redis style).
func parseDur(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}

func orDur(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// NewClient builds a go-redis client (single node or cluster) from cfg.URL,
// for users of the same Redis other than the index (the lease manager).
func NewClient(cfg Config) (redis.UniversalClient, error) {
	o, err := cfg.universalOptions()
	if err != nil {
		return nil, err
	}
	return o.client(), nil
}

func (o *options) client() redis.UniversalClient {
	if o.cluster {
		return redis.NewClusterClient(o.clusterOp)
	}
	return redis.NewClient(o.single)
}
