package redact

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	cases := map[string]string{
		"redis://user:pw1@host:6379/0":                        "redis://xxxxx@host:6379/0",
		`--index "redis://:pw1@h:badport/0": invalid port`:    `--index "redis://xxxxx@h:badport/0": invalid port`,
		"redis-cluster://u:pw1@h1:1,h2:2?namespace=x":         "redis-cluster://xxxxx@h1:1,h2:2?namespace=x",
		"rediss://u:p@w1@h/0":                                 "rediss://xxxxx@h/0",
		"tcp://u:pw1@10.0.0.7:5557 and ipc://a:pw1@/tmp/sock": "tcp://xxxxx@10.0.0.7:5557 and ipc://xxxxx@/tmp/sock",
		"redis://h:1/0?password=pw1&ttl=1h":                   "redis://h:1/0?password=xxxxx&ttl=1h",
		"plain text, tcp://10.0.0.7:5557, a@b":                "plain text, tcp://10.0.0.7:5557, a@b",
		"":                                                    "",
	}
	for in, want := range cases {
		if got := String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every way a secret can reach a log line through slog is masked: message,
// string, error, Stringer, []string, grouped and pre-bound attributes.
func TestLoggerMasksEveryAttribute(t *testing.T) {
	var buf bytes.Buffer
	for _, h := range []slog.Handler{slog.NewTextHandler(&buf, nil), slog.NewJSONHandler(&buf, nil)} {
		l := Logger(slog.New(h)).With("index", "redis://u:pw1@h:1/0")
		l.Info("connect redis://u:pw1@h:1/0 failed",
			"err", errors.New("dial redis://:pw1@h:1: refused"),
			"addr", stringer("tcp://x:pw1@h:1"),
			"list", []string{"ipc://a:pw1@/x"},
			slog.Group("g", "url", "rediss://u:pw1@h"))
		l.WithGroup("sub").Warn("w", "u", "redis://h/0?password=pw1")
	}
	if strings.Contains(buf.String(), "pw1") {
		t.Errorf("secret in log output:\n%s", buf.String())
	}
	if n := strings.Count(buf.String(), Mask); n < 14 {
		t.Errorf("%d masks, want 14:\n%s", n, buf.String())
	}
}

type stringer string

func (s stringer) String() string { return string(s) }
