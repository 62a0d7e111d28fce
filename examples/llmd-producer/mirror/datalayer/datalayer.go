// Package datalayer mirrors llm-d-router's
// pkg/epp/framework/interface/datalayer at
// ebab687927f5331c1b39defcb579a07951bce56c (see package mirror).
package datalayer

import (
	"sync"

	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/plugin"
)

// Cloneable values can be stored on an endpoint.
type Cloneable interface {
	Clone() Cloneable
}

// AttributeMap holds an endpoint's data, keyed by DataKey.
type AttributeMap interface {
	Put(plugin.DataKey, Cloneable)
	Get(plugin.DataKey) (Cloneable, bool)
	Keys() []plugin.DataKey
	Clone() AttributeMap
}

// Attributes is the goroutine-safe AttributeMap; Get returns clones.
type Attributes struct {
	data sync.Map
}

// NewAttributes returns an empty AttributeMap.
func NewAttributes() AttributeMap { return &Attributes{} }

// Put stores value (nil is ignored, as upstream).
func (a *Attributes) Put(key plugin.DataKey, value Cloneable) {
	if value != nil {
		a.data.Store(key, value)
	}
}

// Get returns a clone of the value under key.
func (a *Attributes) Get(key plugin.DataKey) (Cloneable, bool) {
	v, ok := a.data.Load(key)
	if !ok {
		return nil, false
	}
	return v.(Cloneable).Clone(), true
}

// Keys lists the stored keys.
func (a *Attributes) Keys() []plugin.DataKey {
	var keys []plugin.DataKey
	a.data.Range(func(k, _ any) bool {
		keys = append(keys, k.(plugin.DataKey))
		return true
	})
	return keys
}

// Clone copies the map.
func (a *Attributes) Clone() AttributeMap {
	c := NewAttributes()
	a.data.Range(func(k, v any) bool {
		c.Put(k.(plugin.DataKey), v.(Cloneable))
		return true
	})
	return c
}

// ID is upstream's endpoint identity (an alias of Kubernetes'
// types.NamespacedName there).
type ID struct {
	Namespace string
	Name      string
}

// EndpointMetadata describes an inference endpoint.
type EndpointMetadata struct {
	ID          ID
	Name        string
	Address     string
	NodeAddress string
	Port        string
	MetricsHost string
	Labels      map[string]string
	RankIndex   int
}

// Metrics are an endpoint's scraped model-server metrics (the fields the
// producer's test sets; upstream has more).
type Metrics struct {
	RunningRequestsSize int
	WaitingQueueSize    int
	KVCacheUsagePercent float64
	CacheBlockSize      int
}
