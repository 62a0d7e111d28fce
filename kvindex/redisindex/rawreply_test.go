package redisindex

import (
	"strings"
	"testing"
)

// The raw MGET reply splitter: the shapes Redis sends (RESP2 and RESP3
// nulls) split exactly; anything else, truncated or of the wrong shape, is
// an error, never a panic or a silently shorter answer.
func TestBulkArray(t *testing.T) {
	ok := []struct {
		in   string
		n    int
		want []string // "<nil>" for a null
	}{
		{"*3\r\n$3\r\nabc\r\n$-1\r\n$0\r\n\r\n", 3, []string{"abc", "<nil>", ""}},
		{"*2\r\n_\r\n$4\r\na\r\nb\r\n", 2, []string{"<nil>", "a\r\nb"}},
		{"*0\r\n", 0, nil},
	}
	for _, c := range ok {
		r := rawReply{b: []byte(c.in)}
		got, err := r.bulkArray(nil, c.n)
		if err != nil || len(got) != len(c.want) {
			t.Fatalf("%q: %v, %d values", c.in, err, len(got))
		}
		for i, v := range got {
			s := string(v)
			if v == nil {
				s = "<nil>"
			}
			if s != c.want[i] {
				t.Fatalf("%q: value %d = %q, want %q", c.in, i, s, c.want[i])
			}
		}
	}
	bad := []struct {
		in   string
		n    int
		want string
	}{
		{"", 1, "truncated"},
		{"-NOPERM no\r\n", 1, "NOPERM"},
		{":1\r\n", 1, "want an array"},
		{"*2\r\n$1\r\na\r\n", 1, "answered"},
		{"*2\r\n$1\r\na\r\n", 2, "truncated"},
		{"*1\r\n$5\r\nab\r\n", 1, "malformed"},
		{"*1\r\n$x\r\nab\r\n", 1, "malformed"},
		{"*1\r\n+OK\r\n", 1, "element of type"},
		{"*1\r\n$-2\r\n", 1, "malformed"},
	}
	for _, c := range bad {
		r := rawReply{b: []byte(c.in)}
		if _, err := r.bulkArray(nil, c.n); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%q: error %v, want one mentioning %q", c.in, err, c.want)
		}
	}
}

// Records decode back to what encodeRecord wrote; a truncated value is
// reported as malformed at the first incomplete record.
func TestRecordRoundTrip(t *testing.T) {
	v := encodeRecord("0.1.2.pod-a", 1<<40+7) + encodeRecord("3.0.0.b", 1)
	var fields []string
	var epochs []uint64
	pos := 0
	for pos < len(v) {
		f, e, next, ok := nextRecord(v, pos)
		if !ok {
			t.Fatalf("malformed at %d", pos)
		}
		fields, epochs = append(fields, f), append(epochs, e)
		pos = next
	}
	if len(fields) != 2 || fields[0] != "0.1.2.pod-a" || epochs[0] != 1<<40+7 || fields[1] != "3.0.0.b" || epochs[1] != 1 {
		t.Fatalf("decoded %q %v", fields, epochs)
	}
	for cut := 1; cut < len(v); cut++ {
		w := v[:cut]
		pos, n := 0, 0
		for {
			_, _, next, ok := nextRecord(w, pos)
			if !ok {
				break
			}
			pos, n = next, n+1
		}
		if pos == len(w) && n > 0 && cut != len(encodeRecord("0.1.2.pod-a", 0)) {
			t.Fatalf("value cut at %d decoded completely", cut)
		}
	}
}
