package kvevents

import "time"

// ApplyStall is how long the apply path has been stuck: the longest any
// worker has been inside its current item (one BatchSink.Apply or
// ForgetPod); 0 when every worker is idle or between items.
//
// It measures progress, not backlog. A worker that has work starts the next
// item as soon as it finishes one, so a worker that is not stuck in one item
// keeps serving every stream on it in turn (dispatcher_workqueue.go). How much is
// queued, and how old the oldest queued batch is, is what publishers decide
// (a pod with 64 DP ranks has 64 shares of the byte budget), so that is
// reported per pod (StreamStats.ApplyLag) and not used to declare the whole
// daemon unfit. What one publisher can make a single item cost is bounded
// by the message size limit.
func (s *Subscriber) ApplyStall() time.Duration {
	now := time.Now().UnixNano()
	var worst int64
	for i := range s.dispatcher.busy {
		if t := s.dispatcher.busy[i].Load(); t != 0 {
			worst = max(worst, now-t)
		}
	}
	return time.Duration(worst)
}
