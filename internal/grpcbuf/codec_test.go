package grpcbuf

import (
	"slices"
	"testing"

	"google.golang.org/grpc/mem"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// A pooled message (above grpc-go's pooling threshold) decodes the same
// from one buffer (read in place) and from several (as frames arrive), and
// the decoded message does not alias the buffers, which gRPC reuses.
func TestCodecRoundTrip(t *testing.T) {
	ids := make([]uint32, 8192)
	for i := range ids {
		ids[i] = uint32(i * 37)
	}
	in := &kvindexv1.ScoreRequest{Model: "m", Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Packed: kvindexv1.PackTokenIDs(ids)}}}
	data, err := Codec.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	wire := data.Materialize()
	data.Free()
	for _, split := range []int{0, 1000} {
		var bs mem.BufferSlice
		if split == 0 {
			bs = mem.BufferSlice{mem.SliceBuffer(slices.Clone(wire))}
		} else {
			bs = mem.BufferSlice{mem.SliceBuffer(slices.Clone(wire[:split])), mem.SliceBuffer(slices.Clone(wire[split:]))}
		}
		var out kvindexv1.ScoreRequest
		if err := Codec.Unmarshal(bs, &out); err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			clear(b.ReadOnlyData())
		}
		got, err := kvindexv1.UnpackTokenIDs(out.GetTokenIds().GetPacked(), nil)
		if err != nil || out.GetModel() != "m" || !slices.Equal(got, ids) {
			t.Fatalf("split %d: model %q, %d ids, err %v", split, out.GetModel(), len(got), err)
		}
	}
	if _, err := Codec.Marshal(42); err == nil {
		t.Fatal("marshalled a non-message")
	}
}
