package tracing

import (
	"context"
	"net"
	"strconv"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
)

// RedisHook returns a go-redis hook that makes one client span per round
// trip (a command, or a pipeline sent to one node) under the span in the
// command's context: the lookup's, a pick's. Calls without a recording
// span (the index's background work: stats refresh, cleanup, loss checks)
// make none. Only the command name is recorded, never its arguments (block
// keys, pod fields). addr is the node ("host:port"). nil when t is off.
func (t *Tracer) RedisHook(addr string) redis.Hook {
	if t == nil {
		return nil
	}
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	return &redisHook{t: t, host: host, port: p}
}

type redisHook struct {
	t    *Tracer
	host string
	port int
}

func (h *redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !trace.SpanFromContext(ctx).IsRecording() {
			return next(ctx, cmd)
		}
		ctx, span := h.t.Start(ctx, cmd.Name(), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
			DBSystem.String("redis"), DBOperation.String(cmd.Name()), ServerAddress.String(h.host), ServerPort.Int(h.port)))
		err := next(ctx, cmd)
		h.end(span, err)
		return err
	}
}

func (h *redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !trace.SpanFromContext(ctx).IsRecording() {
			return next(ctx, cmds)
		}
		op := "pipeline"
		if len(cmds) > 0 {
			op = cmds[0].Name()
		}
		ctx, span := h.t.Start(ctx, "PIPELINE "+op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
			DBSystem.String("redis"), DBOperation.String(op), DBBatchSize.Int(len(cmds)),
			ServerAddress.String(h.host), ServerPort.Int(h.port)))
		err := next(ctx, cmds)
		h.end(span, err)
		return err
	}
}

func (h *redisHook) end(span trace.Span, err error) {
	if err != nil && err != redis.Nil {
		span.SetAttributes(ErrorType.String("redis_error"))
		Fail(span, "redis_error")
	}
	span.End()
}
