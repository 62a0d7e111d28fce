// Package tenant names the index namespaces of tenants (Dynamo's tenant_id
// or routing_group, Mooncake's tenant_id). A tenant is a namespace of
// models: tenant T's model M is indexed under the internal model name
// Model(T, M), so every index (memory or Redis, both keyed by model) keeps
// T's blocks apart from every other tenant's with no change of its own.
//
// The default tenant's model M is M itself, so single-tenant deployments
// and every API without a tenant see the names they always did. Another
// tenant's is T + Sep + M. Sep is a backslash: HuggingFace model ids never
// hold one (kvindexd's tokenizer registry refuses it too), and the tenant
// APIs refuse model names and tenant ids containing it, so an internal name
// splits one way only and never equals a real model's name.
package tenant

import (
	"fmt"
	"strings"
	"unicode"
)

// Default is the tenant of a request that names none (Dynamo's and
// Mooncake's default tenant_id).
const Default = "default"

// Sep separates the tenant from the model in an internal model name.
const Sep = '\\'

// MaxLen bounds a tenant id: it is part of every key of its blocks.
const MaxLen = 128

// Check reports why t cannot be a tenant id: empty, too long, holding Sep,
// a control character or a space.
func Check(t string) error {
	switch {
	case t == "":
		return fmt.Errorf("tenant_id is empty")
	case len(t) > MaxLen:
		return fmt.Errorf("tenant_id %.32q...: longer than %d bytes", t, MaxLen)
	}
	for _, r := range t {
		if r == Sep || unicode.IsControl(r) || unicode.IsSpace(r) {
			return fmt.Errorf("tenant_id %q: %q is not allowed in a tenant id", t, r)
		}
	}
	return nil
}

// CheckModel reports why model cannot be served to a tenant: it holds Sep,
// which would make its internal name ambiguous.
func CheckModel(model string) error {
	if strings.IndexByte(model, Sep) >= 0 {
		return fmt.Errorf("model_name %q: a backslash is reserved (it separates a tenant from its model names)", model)
	}
	return nil
}

// Model is tenant t's model m as the index names it: m for the default
// tenant (or t == ""), t + Sep + m otherwise. t and m are assumed checked.
func Model(t, m string) string {
	if t == "" || t == Default {
		return m
	}
	return t + string(Sep) + m
}

// Split undoes Model: the tenant and the model of an internal name
// (Default and name itself for a name without Sep).
func Split(name string) (t, m string) {
	if i := strings.IndexByte(name, Sep); i >= 0 {
		return name[:i], name[i+1:]
	}
	return Default, name
}

// Base is the model of an internal name without allocating: a tenant's
// model is configured (block size, hash seed, tokenizer) as the model
// itself.
func Base(name string) string {
	if i := strings.IndexByte(name, Sep); i >= 0 {
		return name[i+1:]
	}
	return name
}
