package kvindexv1

import (
	"encoding/binary"
	"errors"
	"unsafe"
)

// littleEndian: the machine lays a uint32 out as TokenIDs.packed does, so
// packing and unpacking are views of the same memory, not copies.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// ErrPackedLength is a TokenIDs.packed whose length is not a multiple of 4.
var ErrPackedLength = errors.New("token_ids.packed: length is not a multiple of 4 (little-endian uint32 per token)")

// PackTokenIDs returns ids in the layout of TokenIDs.packed. On a
// little-endian machine it is ids' own memory (no copy): leave ids
// unchanged until the message is sent.
func PackTokenIDs(ids []uint32) []byte {
	if len(ids) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 4*len(ids))
	}
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], id)
	}
	return b
}

// UnpackTokenIDs reads TokenIDs.packed. On a little-endian machine, with
// packed 4-byte aligned (as protobuf's decoder allocates it), the result is
// a view of packed (no copy, dst unused); otherwise the ids are decoded
// into dst, grown as needed, so a caller reusing dst allocates nothing.
func UnpackTokenIDs(packed []byte, dst []uint32) ([]uint32, error) {
	if len(packed)%4 != 0 {
		return nil, ErrPackedLength
	}
	n := len(packed) / 4
	if n == 0 {
		return dst[:0], nil
	}
	if littleEndian && uintptr(unsafe.Pointer(&packed[0]))%4 == 0 {
		return unsafe.Slice((*uint32)(unsafe.Pointer(&packed[0])), n), nil
	}
	if cap(dst) < n {
		dst = make([]uint32, n)
	}
	dst = dst[:n]
	for i := range dst {
		dst[i] = binary.LittleEndian.Uint32(packed[4*i:])
	}
	return dst, nil
}
