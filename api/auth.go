package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scope is what a bearer token may do. Admin includes read.
type Scope uint8

const (
	// ScopeNone: probes (/healthz, /readyz, grpc.health.v1) need no token.
	ScopeNone Scope = iota
	// ScopeRead: scores, pod and endpoint listings, metrics when protected,
	// reflection, and every path not named below.
	ScopeRead
	// ScopeAdmin: endpoint management (POST/DELETE /v1/endpoints,
	// Dynamo's POST /register and /unregister, AddEndpoint, RemoveEndpoint)
	// and a copy of the whole index for a peer (GET /v1/admin/snapshot).
	ScopeAdmin
)

func (s Scope) String() string {
	switch s {
	case ScopeRead:
		return "read"
	case ScopeAdmin:
		return "admin"
	}
	return "none"
}

// MinTokenLen is the shortest token a token file may hold: a short token
// can be guessed by an unauthenticated client.
const MinTokenLen = 16

// Tokens are the bearer tokens of a token file, reloaded when the file
// changes. Each line is "<token> <scope>" (scope read or admin; admin
// includes read); blank lines and lines starting with '#' are ignored.
// Tokens are kept only as SHA-256 digests and compared in constant time.
type Tokens struct {
	path string
	log  *slog.Logger
	set  atomic.Pointer[tokenSet]

	mu    sync.Mutex // serializes reloads
	stamp fileStamp
	// sum is the digest of the file last loaded. The stamp is taken before
	// the read, so a file rewritten in between (truncated when stamped,
	// whole when read) changes stamp once more without changing content:
	// only a new digest is a reload.
	sum [sha256.Size]byte
}

type tokenSet struct {
	sums   [][sha256.Size]byte
	scopes []Scope
	admin  bool
}

// LoadTokens reads a token file. An empty file (no token) is an error: it
// would lock every client out while looking configured.
func LoadTokens(path string, log *slog.Logger) (*Tokens, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tokens{path: path, log: log}
	if err := t.reload(true); err != nil {
		return nil, err
	}
	return t, nil
}

// parseTokens parses the content of a token file.
func parseTokens(data []byte) (*tokenSet, error) {
	ts := &tokenSet{}
	seen := map[[sha256.Size]byte]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		// The token itself is never echoed: the error names the line.
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want \"<token> <scope>\" (scope read or admin)", n)
		}
		if len(f[0]) < MinTokenLen {
			return nil, fmt.Errorf("line %d: token shorter than %d characters", n, MinTokenLen)
		}
		var s Scope
		switch f[1] {
		case "read":
			s = ScopeRead
		case "admin":
			s = ScopeAdmin
			ts.admin = true
		default:
			return nil, fmt.Errorf("line %d: scope %q: want read or admin", n, f[1])
		}
		sum := sha256.Sum256([]byte(f[0]))
		if seen[sum] {
			return nil, fmt.Errorf("line %d: token listed twice", n)
		}
		seen[sum] = true
		ts.sums = append(ts.sums, sum)
		ts.scopes = append(ts.scopes, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(ts.sums) == 0 {
		return nil, fmt.Errorf("no token in the file")
	}
	return ts, nil
}

// fileStamp tells a changed file from an unchanged one without reading it
// (a Kubernetes secret update swaps a symlink: size or mtime change).
type fileStamp struct {
	size  int64
	mtime time.Time
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{fi.Size(), fi.ModTime()}, nil
}

func (t *Tokens) reload(force bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, err := stampOf(t.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	if !force && st == t.stamp {
		return nil
	}
	data, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	sum := sha256.Sum256(data)
	if !force && sum == t.sum {
		t.stamp = st
		return nil
	}
	ts, err := parseTokens(data)
	if err != nil {
		return fmt.Errorf("token file %s: %w", t.path, err)
	}
	t.set.Store(ts)
	t.stamp, t.sum = st, sum
	return nil
}

// Watch reloads the file every interval when it changed, until ctx is done.
// A file that stops parsing keeps the tokens loaded before (logged).
func (t *Tokens) Watch(ctx context.Context, interval time.Duration) {
	tk := time.NewTicker(interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			before := t.set.Load()
			if err := t.reload(false); err != nil {
				t.log.Error("token file reload failed; keeping the tokens loaded before", "err", err)
			} else if t.set.Load() != before {
				t.log.Info("token file reloaded", "path", t.path, "tokens", len(t.set.Load().sums))
			}
		}
	}
}

// HasAdmin reports whether an admin token is configured.
func (t *Tokens) HasAdmin() bool { return t.set.Load().admin }

// Check returns the scope of a bearer token ("" or unknown: ScopeNone). Every
// configured token is compared, in constant time on equal-length digests,
// so neither the position of a match nor a token's length leaks.
func (t *Tokens) Check(token string) Scope {
	if token == "" {
		return ScopeNone
	}
	ts := t.set.Load()
	sum := sha256.Sum256([]byte(token))
	best := ScopeNone
	for i := range ts.sums {
		if subtle.ConstantTimeCompare(sum[:], ts.sums[i][:]) == 1 && ts.scopes[i] > best {
			best = ts.scopes[i]
		}
	}
	return best
}

// bearer extracts the token of an "Authorization: Bearer <token>" value
// (the scheme is case-insensitive, RFC 6750).
func bearer(h string) string {
	const p = "bearer "
	if len(h) > len(p) && strings.EqualFold(h[:len(p)], p) {
		return strings.TrimSpace(h[len(p):])
	}
	return ""
}
