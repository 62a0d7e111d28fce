package zmtp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Wire constants of ZMTP 3.x (RFC 23/ZMTP and RFC 37/ZMTP).
const (
	greetingLen  = 64
	signatureLen = 10

	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	flagReserved = 0xf8

	// maxCommandSize caps every command frame (READY, PING, ERROR, ...).
	// libzmq's READY carries Socket-Type and an Identity of at most 255
	// bytes; 16 KiB leaves room for application metadata while keeping a
	// hostile handshake cheap.
	maxCommandSize = 16 << 10

	// maxPingContext is the largest PING context RFC 37 allows.
	maxPingContext = 16

	// maxSubscriptions and maxTopicSize cap what one subscriber can make a
	// Pub hold.
	maxSubscriptions = 1024
	maxTopicSize     = 4 << 10
)

// Errors a connection or socket reports. Wrapped errors carry detail; test
// with errors.Is.
var (
	ErrClosed        = errors.New("zmtp: socket closed")
	ErrProtocol      = errors.New("zmtp: protocol error")
	ErrTooLarge      = errors.New("zmtp: message exceeds the size limit")
	ErrTooManyFrames = errors.New("zmtp: message exceeds the frame limit")
	ErrBufferBudget  = errors.New("zmtp: receive buffer budget exhausted")
	// ErrMessageTimeout: a message did not arrive whole within
	// Options.MessageTimeout of its first byte.
	ErrMessageTimeout = errors.New("zmtp: message not complete within the message timeout")
	// ErrMessageLost wraps the reason a connection ended in the middle of
	// a message: the peer's message is lost, and whatever it belonged to
	// (a pod's stream) has missed it. OnDisconnect sees it with errors.Is.
	ErrMessageLost = errors.New("zmtp: message lost")
	// ErrEvicted: an idle connection was closed to make room on a full
	// bound socket (Options.EvictIdleAfter).
	ErrEvicted          = errors.New("zmtp: idle connection evicted to make room")
	ErrHandshakeTimeout = errors.New("zmtp: handshake timed out")
	ErrHeartbeatTimeout = errors.New("zmtp: peer silent past the heartbeat timeout")
	ErrPeerError        = errors.New("zmtp: peer sent ERROR")
)

func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, args...))
}

// ourGreeting is what every connection sends first: ZMTP 3.1, NULL
// mechanism, as-server 0 (NULL has no client/server roles).
func ourGreeting() []byte {
	g := make([]byte, greetingLen)
	g[0] = 0xff
	g[9] = 0x7f
	g[10], g[11] = 3, 1
	copy(g[12:32], "NULL")
	return g
}

// checkSignature validates the first 10 greeting bytes. Checking them before
// reading the rest drops a peer that is not speaking ZMTP 3.x (an HTTP probe,
// ZMTP 1.0) early.
func checkSignature(b []byte) error {
	if len(b) != signatureLen {
		return protoErr("signature of %d bytes", len(b))
	}
	if b[0] != 0xff || b[9] != 0x7f {
		return protoErr("not a ZMTP 3 signature")
	}
	return nil
}

// parseGreeting validates a peer's 64-byte greeting and returns the minor
// version both sides speak: 0 for ZMTP 3.0, 1 for 3.1. A peer announcing a
// later version is talked to as 3.1, as RFC 23 asks of the older side.
func parseGreeting(b []byte) (minor byte, err error) {
	if len(b) != greetingLen {
		return 0, protoErr("greeting of %d bytes", len(b))
	}
	if err := checkSignature(b[:signatureLen]); err != nil {
		return 0, err
	}
	major := b[10]
	if major < 3 {
		return 0, protoErr("peer speaks ZMTP %d.x; 3.0 or later required", major)
	}
	mech := b[12:32]
	if !bytes.Equal(bytes.TrimRight(mech, "\x00"), []byte("NULL")) {
		return 0, protoErr("security mechanism %q not supported (NULL only)", printable(bytes.TrimRight(mech, "\x00")))
	}
	if major == 3 && b[11] == 0 {
		return 0, nil
	}
	return 1, nil
}

// printable bounds and escapes peer bytes that end up in an error message.
func printable(b []byte) string {
	const limit = 64
	if len(b) > limit {
		b = b[:limit]
	}
	return strings.ToValidUTF8(string(b), "?")
}

// appendFrameHeader appends the flags and size of a frame of n bytes.
func appendFrameHeader(dst []byte, flags byte, n int) []byte {
	if n <= 255 {
		return append(dst, flags, byte(n))
	}
	return binary.BigEndian.AppendUint64(append(dst, flags|flagLong), uint64(n))
}

// appendCommand appends a whole command frame.
func appendCommand(dst []byte, name string, data []byte) []byte {
	dst = appendFrameHeader(dst, flagCommand, 1+len(name)+len(data))
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	return append(dst, data...)
}

// appendProperty appends one metadata property (READY's body).
func appendProperty(dst []byte, name, value string) []byte {
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(value)))
	return append(dst, value...)
}

// parseCommand splits a command frame's body into its name and data.
func parseCommand(body []byte) (name string, data []byte, err error) {
	if len(body) == 0 {
		return "", nil, protoErr("empty command frame")
	}
	n := int(body[0])
	if n == 0 {
		return "", nil, protoErr("command with an empty name")
	}
	if n > len(body)-1 {
		return "", nil, protoErr("command name of %d bytes in a %d-byte frame", n, len(body))
	}
	return string(body[1 : 1+n]), body[1+n:], nil
}

// parseMetadata walks READY's properties, calling fn for each, and rejects
// any length that runs past the data: a truncated or oversized property is
// an error, never a slice out of range.
func parseMetadata(data []byte, fn func(name string, value []byte)) error {
	for len(data) > 0 {
		n := int(data[0])
		if n == 0 {
			return protoErr("metadata property with an empty name")
		}
		if len(data) < 1+n+4 {
			return protoErr("metadata truncated in a property name")
		}
		name := string(data[1 : 1+n])
		data = data[1+n:]
		vlen := binary.BigEndian.Uint32(data)
		data = data[4:]
		if uint64(vlen) > uint64(len(data)) {
			return protoErr("metadata property %q declares %d bytes, %d left", printable([]byte(name)), vlen, len(data))
		}
		fn(name, data[:vlen])
		data = data[vlen:]
	}
	return nil
}

// parseReady returns the peer's Socket-Type and Identity from READY's data.
func parseReady(data []byte) (socketType string, identity []byte, err error) {
	err = parseMetadata(data, func(name string, value []byte) {
		switch {
		case strings.EqualFold(name, "Socket-Type"):
			socketType = string(value)
		case strings.EqualFold(name, "Identity"):
			identity = value
		}
	})
	if err != nil {
		return "", nil, err
	}
	if socketType == "" {
		return "", nil, protoErr("READY without a Socket-Type")
	}
	return socketType, identity, nil
}

// parsePing returns PING's context, which PONG echoes.
func parsePing(data []byte) ([]byte, error) {
	if len(data) < 2 {
		return nil, protoErr("PING without a TTL")
	}
	ctx := data[2:]
	if len(ctx) > maxPingContext {
		return nil, protoErr("PING context of %d bytes (max %d)", len(ctx), maxPingContext)
	}
	return ctx, nil
}

// parseErrorReason returns ERROR's reason text.
func parseErrorReason(data []byte) string {
	if len(data) == 0 {
		return ""
	}
	n := int(data[0])
	if n > len(data)-1 {
		n = len(data) - 1
	}
	return printable(data[1 : 1+n])
}

// compatible reports whether a socket of type ours may talk to a peer of
// type peer (RFC 23's socket-type table, for the types this package has).
func compatible(ours, peer string) bool {
	switch ours {
	case "SUB":
		return peer == "PUB" || peer == "XPUB"
	case "DEALER":
		return peer == "ROUTER" || peer == "DEALER" || peer == "REP"
	case "PUB":
		return peer == "SUB" || peer == "XSUB"
	case "ROUTER":
		return peer == "DEALER" || peer == "REQ" || peer == "ROUTER"
	}
	return false
}
