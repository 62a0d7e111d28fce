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
	// server_walk=true (single node, see ServerWalk),
	// dial_timeout, read_timeout, write_timeout, pool_size, tls=true,
	// insecure_skip_verify=true, server_name. Single-node URLs also accept
	// every option go-redis ParseURL knows.
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
	// the server and stops reading at the first miss, instead of one
	// pipeline that reads every key. Measured on a 512-key, 8-pod prompt:
	// ~25% faster when most of the prompt is new, ~2x slower when it is
	// all warm, and the script blocks Redis for its whole walk. Off by
	// default.
	ServerWalk bool
	// CleanupQueue bounds the queue of stale entries waiting for lazy
	// deletion (default 65536); when full, stale entries are left for a later
	// read or for the TTL.
	CleanupQueue int
	// Logger receives the index's few log lines (the warning that TTL
	// expirations cannot be counted because keyspace notifications are off).
	// Default slog.Default().
	Logger *slog.Logger
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
}

// ourOptions are consumed here and removed before go-redis sees the URL.
var ourOptions = []string{"namespace", "ttl", "tls", "insecure_skip_verify", "server_name", "server_walk"}

func (c *Config) universalOptions() (*options, error) {
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
	o := &options{cluster: cluster, serverWalk: c.ServerWalk}
	if v := q.Get("server_walk"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("server_walk: %w", err)
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
			return nil, fmt.Errorf("ttl: %w", err)
		}
		ttl = d
		if d == 0 {
			ttl = -1
		}
	}
	if o.namespace, o.ttl, err = c.namespaceAndTTL(ns, ttl); err != nil {
		return nil, err
	}
	if v := q.Get("tls"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		tlsOn = tlsOn || b
	}
	var tlsCfg *tls.Config
	if tlsOn {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: q.Get("server_name")}
		if v := q.Get("insecure_skip_verify"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, fmt.Errorf("insecure_skip_verify: %w", err)
			}
			tlsCfg.InsecureSkipVerify = b
		}
	}
	if c.TLS != nil {
		tlsCfg = c.TLS
	}
	for _, k := range ourOptions {
		q.Del(k)
	}

	dial, rd, wr := orDur(c.DialTimeout, DefaultDialTimeout), orDur(c.ReadTimeout, DefaultIOTimeout), orDur(c.WriteTimeout, DefaultIOTimeout)
	maxRetries := c.MaxRetries
	if maxRetries == 0 {
		maxRetries = 1
	}
	if !cluster {
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
			so.DialTimeout = dial
		}
		if !q.Has("read_timeout") {
			so.ReadTimeout = rd
		}
		if !q.Has("write_timeout") {
			so.WriteTimeout = wr
		}
		if !q.Has("max_retries") {
			so.MaxRetries = maxRetries
		}
		if c.PoolSize > 0 {
			so.PoolSize = c.PoolSize
		}
		so.TLSConfig = tlsCfg
		so.Protocol = 2
		so.DialerRetries, so.DialerRetryTimeout = dialerRetries, dialerRetryWait
		so.DisableIdentity = true
		o.single = so
		return o, nil
	}

	// Cluster: [user[:pass]@]h1:p1,h2:p2[/]
	co := &redis.ClusterOptions{}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		userinfo := rest[:i]
		rest = rest[i+1:]
		user, pass, hasPass := strings.Cut(userinfo, ":")
		if !hasPass {
			// redis-cluster://password@hosts is ambiguous; follow redis://
			// conventions: a lone userinfo is a user name.
			pass = ""
		}
		var err error
		if co.Username, err = url.PathUnescape(user); err != nil {
			return nil, fmt.Errorf("user: %w", err)
		}
		if co.Password, err = url.PathUnescape(pass); err != nil {
			return nil, fmt.Errorf("password: %w", err)
		}
	}
	rest = strings.TrimSuffix(rest, "/")
	if strings.Contains(rest, "/") {
		return nil, fmt.Errorf("redis-cluster URLs take no database number (Cluster has only db 0)")
	}
	for _, a := range strings.Split(rest, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		host, port, err := splitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("cluster node %q: %w", a, err)
		}
		co.Addrs = append(co.Addrs, host+":"+port)
	}
	if len(co.Addrs) == 0 {
		return nil, fmt.Errorf("redis-cluster URL names no node")
	}
	co.DialTimeout, co.ReadTimeout, co.WriteTimeout = dial, rd, wr
	co.MaxRetries = maxRetries
	for k, vs := range q {
		v := vs[len(vs)-1]
		var d time.Duration
		var err error
		switch k {
		case "dial_timeout", "read_timeout", "write_timeout":
			d, err = parseDur(v)
			switch k {
			case "dial_timeout":
				co.DialTimeout = d
			case "read_timeout":
				co.ReadTimeout = d
			default:
				co.WriteTimeout = d
			}
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
			return nil, fmt.Errorf("option %s=%q: %w", k, v, err)
		}
	}
	if c.PoolSize > 0 {
		co.PoolSize = c.PoolSize
	}
	co.TLSConfig = tlsCfg
	co.Protocol = 2
	co.DialerRetries, co.DialerRetryTimeout = dialerRetries, dialerRetryWait
	co.DisableIdentity = true
	o.clusterOp = co
	return o, nil
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
