package zmtp

import (
	"context"
	"fmt"
	"net"
	"testing"
)

// BenchmarkSubRecv measures a bound Sub receiving vLLM-shaped messages
// ([topic, seq8, payload]) from one publisher over loopback TCP.
func BenchmarkSubRecv(b *testing.B) {
	for _, size := range []int{512, 64 << 10} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			sub, err := ListenSub("tcp://127.0.0.1:0", Options{}, "kv@")
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			c, err := net.Dial("tcp", sub.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(cat(rawGreeting(1), rawReady("PUB"))); err != nil {
				b.Fatal(err)
			}
			msg := rawMessage([]byte("kv@pod-a@model"), seq8(1), make([]byte, size))
			batch := make([]byte, 0, 64*len(msg))
			for range 64 {
				batch = append(batch, msg...)
			}
			go func() {
				// Our side's greeting, READY and SUBSCRIBE are never read:
				// they fit in the socket buffer.
				for sent := 0; sent < b.N; sent += 64 {
					if _, err := c.Write(batch); err != nil {
						return
					}
				}
			}()
			ctx := context.Background()
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := sub.Recv(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
