package main

import (
	"bytes"
	"strings"
	"testing"
)

// A bad --index (flag or KVINDEX_INDEX) stops the daemon with an error
// that names the problem and never prints the password, on either stream.
func TestIndexURLPasswordNeverPrinted(t *testing.T) {
	bad := []string{
		"redis://user:s3cr3tpw@host:badport/0",
		"redis://user:s3cr3tpw@[::1/0",
		"redis-cluster://user:s3cr3tpw@h1:1,h2:badport",
		"rediss://:s3cr3tpw@host:1?ttl=soon",
	}
	for _, v := range bad {
		for _, viaEnv := range []bool{false, true} {
			args := []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--zmq-bind", "tcp://127.0.0.1:0"}
			if viaEnv {
				t.Setenv("KVINDEX_INDEX", v)
			} else {
				t.Setenv("KVINDEX_INDEX", "")
				args = append(args, "--index", v)
			}
			var stdout, stderr bytes.Buffer
			code := run(args, strings.NewReader(""), &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code == 0 || !strings.Contains(out, "--index") {
				t.Errorf("%q (env %v): exit %d, output %q; want a failure naming --index", v, viaEnv, code, out)
			}
			if strings.Contains(out, "s3cr3tpw") {
				t.Errorf("%q (env %v): the password is printed: %q", v, viaEnv, out)
			}
		}
	}
}
