package redisindex

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// rawReply collects one raw RESP reply (redis.RawWriteToCmd writes into it).
type rawReply struct{ b []byte }

func (r *rawReply) Write(p []byte) (int, error) {
	r.b = append(r.b, p...)
	return len(p), nil
}

// ReadFrom lets io.Copy (which go-redis uses for each bulk string) read
// straight into the buffer instead of allocating a copy buffer per value.
func (r *rawReply) ReadFrom(src io.Reader) (int64, error) {
	var total int64
	for {
		if len(r.b) == cap(r.b) {
			r.b = append(r.b, 0)[:len(r.b)]
		}
		n, err := src.Read(r.b[len(r.b):cap(r.b)])
		r.b = r.b[:len(r.b)+n]
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// bulkArray splits the reply, which must be an array of n bulk strings or
// nulls (MGET's shape, RESP2 or RESP3), into dst: one slice per element
// pointing into the reply, nil for a null.
func (r *rawReply) bulkArray(dst [][]byte, n int) ([][]byte, error) {
	b := r.b
	line, rest, ok := respLine(b)
	if !ok || len(line) == 0 {
		return dst, errors.New("redisindex: truncated MGET reply")
	}
	if line[0] == '-' {
		return dst, fmt.Errorf("redisindex: MGET: %s", line[1:])
	}
	if line[0] != '*' {
		return dst, fmt.Errorf("redisindex: MGET reply of type %q, want an array", line[0])
	}
	if cnt, err := strconv.Atoi(string(line[1:])); err != nil || cnt != n {
		return dst, fmt.Errorf("redisindex: MGET of %d keys answered %q values", n, line[1:])
	}
	for i := 0; i < n; i++ {
		line, rest, ok = respLine(rest)
		if !ok || len(line) == 0 {
			return dst, errors.New("redisindex: truncated MGET reply")
		}
		switch {
		case line[0] == '_' || string(line) == "$-1":
			dst = append(dst, nil)
		case line[0] == '$':
			l, err := strconv.Atoi(string(line[1:]))
			if err != nil || l < 0 || l+2 > len(rest) {
				return dst, errors.New("redisindex: malformed MGET reply")
			}
			dst = append(dst, rest[:l:l])
			rest = rest[l+2:]
		default:
			return dst, fmt.Errorf("redisindex: MGET element of type %q", line[0])
		}
	}
	return dst, nil
}

// respLine splits off one CRLF-terminated line.
func respLine(b []byte) (line, rest []byte, ok bool) {
	i := bytes.Index(b, crlf)
	if i < 0 {
		return nil, nil, false
	}
	return b[:i], b[i+2:], true
}

var crlf = []byte("\r\n")
