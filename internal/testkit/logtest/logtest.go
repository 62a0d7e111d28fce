// Package logtest is a log sink for tests: the code under test logs from
// its own goroutines (servers, subscribers, watchers, child processes'
// stderr) while the test reads what was logged, so the buffer must be safe
// for both at once. Never for production use.
package logtest

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Buffer collects log output; its zero value is ready to use and every
// method is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Line returns the first line written so far that contains substr, or ""
// if none does.
func (l *Buffer) Line(substr string) string {
	for s := range strings.SplitSeq(l.String(), "\n") {
		if strings.Contains(s, substr) {
			return s
		}
	}
	return ""
}

// Logger returns a logger writing text lines (slog's text handler, default
// options) to l.
func (l *Buffer) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }
