// Package plugin mirrors llm-d-router's pkg/epp/framework/interface/plugin
// at ebab687927f5331c1b39defcb579a07951bce56c (see package mirror).
package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
)

// TypedName is a plugin's type and instance name.
type TypedName struct {
	Type string
	Name string
}

// String renders "<name>/<type>", as upstream.
func (tn TypedName) String() string { return tn.Name + "/" + tn.Type }

// Plugin is embedded by every plugin interface.
type Plugin interface {
	TypedName() TypedName
}

// DataKey names data passed from producers to consumers: its type and the
// producing instance.
type DataKey struct {
	dataType     string
	producerName string
}

// NewDataKey creates a key with a default producer name.
func NewDataKey(dataType, defaultProducerName string) DataKey {
	return DataKey{dataType: dataType, producerName: defaultProducerName}
}

// WithNonEmptyProducerName returns the key bound to name, or unchanged when
// name is empty.
func (dk DataKey) WithNonEmptyProducerName(name string) DataKey {
	if name != "" {
		dk.producerName = name
	}
	return dk
}

// String renders "DataType/ProducerName".
func (dk DataKey) String() string { return fmt.Sprintf("%s/%s", dk.dataType, dk.producerName) }

// DataDependencies are the keys a consumer needs (Required) or can use.
type DataDependencies struct {
	Required map[DataKey]any
	Optional map[DataKey]any
}

// ConsumerPlugin declares what it consumes.
type ConsumerPlugin interface {
	Plugin
	Consumes() DataDependencies
}

// ProducerPlugin declares what it produces.
type ProducerPlugin interface {
	Plugin
	Produces() map[DataKey]any
}

// StateDumper exposes bounded debug state.
type StateDumper interface {
	DumpState() (json.RawMessage, error)
}

// Handle is what a factory gets from the framework (upstream also carries
// the plugin set, the pod list and a metrics recorder).
type Handle interface {
	Context() context.Context
}

// FactoryFunc builds a plugin from its instance name and its strictly
// decoded parameters (nil when the configuration has none).
type FactoryFunc func(name string, parameters *json.Decoder, handle Handle) (Plugin, error)

// StrictDecoder is the framework's decoder over a plugin's raw parameters:
// unknown fields are errors; nil for no parameters.
func StrictDecoder(raw json.RawMessage) *json.Decoder {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec
}

// StabilityLevel is a plugin type's maturity.
type StabilityLevel string

// Upstream's stability levels.
const (
	StabilityAlpha  StabilityLevel = "Alpha"
	StabilityBeta   StabilityLevel = "Beta"
	StabilityStable StabilityLevel = "Stable"
)

// Registry maps a plugin type to its factory.
var Registry = map[string]FactoryFunc{}

// Register records a plugin type's factory.
func Register(pluginType string, _ StabilityLevel, factory FactoryFunc) {
	Registry[pluginType] = factory
}
