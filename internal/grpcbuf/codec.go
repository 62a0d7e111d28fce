package grpcbuf

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// Codec is grpc-go's proto codec with Pool in place of grpc-go's default
// pool, which its own codec uses whatever pool the connection was given.
// It also decodes a message that arrived in one buffer where it lies,
// without first copying it into a pooled one. Give it to both ends:
// grpc.ForceServerCodecV2(Codec) and
// grpc.WithDefaultCallOptions(grpc.ForceCodecV2(Codec)).
var Codec encoding.CodecV2 = codec{}

type codec struct{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("proto: cannot marshal %T, want proto.Message", v)
	}
	size := proto.Size(m)
	// UseCachedSize reuses the Size just computed (the message is not
	// mutated concurrently, as grpc-go's codec assumes too).
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := Pool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		Pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, Pool)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m := messageOf(v)
	if m == nil {
		return fmt.Errorf("proto: cannot unmarshal into %T, want proto.Message", v)
	}
	// proto.Unmarshal copies what it keeps (bytes and strings), so the
	// message never aliases data, which the caller frees.
	if len(data) == 1 {
		return proto.Unmarshal(data[0].ReadOnlyData(), m)
	}
	buf := data.MaterializeToBuffer(Pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	case protoadapt.MessageV2:
		return v
	}
	return nil
}
