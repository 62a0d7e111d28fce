package kvindexv1

import (
	"errors"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestPackedTokenIDsRoundTrip(t *testing.T) {
	ids := []uint32{0, 1, 127, 128, 151_935, 1 << 31, 0xffffffff}
	b, err := proto.Marshal(&TokenIDs{Packed: PackTokenIDs(ids)})
	if err != nil {
		t.Fatal(err)
	}
	var m TokenIDs
	if err := proto.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	// The wire layout is little-endian whatever the machine's.
	if m.Packed[4*3] != 128 || m.Packed[4*3+1] != 0 || m.Packed[4*5+3] != 0x80 {
		t.Fatalf("packed bytes % x", m.Packed)
	}
	got, err := UnpackTokenIDs(m.Packed, nil)
	if err != nil || !slices.Equal(got, ids) {
		t.Fatalf("unpacked %v, %v", got, err)
	}
	// Misaligned input is decoded into dst.
	odd := append([]byte{0}, m.Packed...)[1:]
	dst := make([]uint32, 0, 16)
	got, err = UnpackTokenIDs(odd, dst)
	if err != nil || !slices.Equal(got, ids) {
		t.Fatalf("unaligned: %v, %v", got, err)
	}
	if _, err := UnpackTokenIDs(m.Packed[:5], nil); !errors.Is(err, ErrPackedLength) {
		t.Fatalf("5 bytes: %v", err)
	}
	if got, err := UnpackTokenIDs(nil, nil); err != nil || len(got) != 0 || PackTokenIDs(nil) != nil {
		t.Fatalf("empty: %v, %v", got, err)
	}
}
