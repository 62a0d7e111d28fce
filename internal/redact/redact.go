// Package redact removes credentials from text before it reaches a log line
// or an error answer: the user information of every URL in the text
// (scheme://user:password@host becomes scheme://xxxxx@host) and the value of
// password-like query parameters. It works on free text because errors wrap
// URLs inside longer messages (a dial error, a config error, a Redis URL
// inside "--index ...: invalid port").
package redact

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
)

// Mask replaces what was hidden.
const Mask = "xxxxx"

var (
	// The user information runs from "scheme://" to the LAST '@' before the
	// path: a password with a raw '@' in it is hidden whole.
	userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s?#"'<>]*@`)
	params   = regexp.MustCompile(`(?i)([?&;](?:password|passwd|pwd|pass|token|secret|auth|access_token)=)[^&\s"'<>]*`)
)

// String returns s with credentials masked. Text without "://" or "=" is
// returned as is without scanning further (the common case).
func String(s string) string {
	if strings.Contains(s, "://") && strings.Contains(s, "@") {
		s = userinfo.ReplaceAllString(s, "${1}"+Mask+"@")
	}
	if strings.Contains(s, "=") {
		s = params.ReplaceAllString(s, "${1}"+Mask)
	}
	return s
}

// Error is err's message with credentials masked ("" for nil).
func Error(err error) string {
	if err == nil {
		return ""
	}
	return String(err.Error())
}

// Logger wraps l so that every message and attribute it writes is masked,
// whatever code produced it (our errors, a library's).
func Logger(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(handler); ok {
		return l
	}
	return slog.New(handler{l.Handler()})
}

type handler struct{ next slog.Handler }

func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, String(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = attr(a)
	}
	return handler{h.next.WithAttrs(red)}
}

func (h handler) WithGroup(name string) slog.Handler { return handler{h.next.WithGroup(name)} }

func attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, String(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, x := range g {
			red[i] = attr(x)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, String(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, String(x.String()))
		case []string:
			red := make([]string, len(x))
			for i, s := range x {
				red[i] = String(s)
			}
			return slog.Any(a.Key, red)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// Writer masks what is written to w. Each Write is masked on its own, so a
// writer that splits a URL over two writes defeats it; the flag package and
// fmt.Fprintf write whole messages.
func Writer(w io.Writer) io.Writer { return writer{w} }

type writer struct{ w io.Writer }

func (r writer) Write(p []byte) (int, error) {
	if _, err := io.WriteString(r.w, String(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
