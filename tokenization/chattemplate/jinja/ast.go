package jinja

// The syntax tree. Expression and statement types are exported so callers
// can inspect a template (for example to see what it iterates over) with
// Walk; they are built only by Parse.

// Node is any statement or expression of a parsed template.
type Node interface{ node() }

// Statements.
type (
	// Output is template data or a {{ expression }}.
	Output struct {
		Text string // set for template data
		Expr Node   // set for {{ ... }}
	}
	// If is {% if %}...{% elif %}...{% else %}...{% endif %}.
	If struct {
		Cond Node
		Body []Node
		Else []Node // an elif is an If as the only Else node
	}
	// For is {% for Target in Iter [if Filter] %}Body{% else %}Else{% endfor %}.
	For struct {
		Target Node // *Name or *Tuple of *Name
		Iter   Node
		Filter Node
		Body   []Node
		Else   []Node
	}
	// Assign is {% set Target = Value %}; Target is a *Name, a *Tuple of
	// names, or an *Attr on a namespace.
	Assign struct {
		Target Node
		Value  Node
	}
	// AssignBlock is {% set Target [| filters] %}Body{% endset %}.
	AssignBlock struct {
		Target  Node
		Filters []*Filter // applied in order, each with a nil Arg
		Body    []Node
	}
	// Macro is {% macro Name(Params) %}Body{% endmacro %}.
	Macro struct {
		Name     string
		Params   []string
		Defaults []Node // aligned to the last len(Defaults) params
		Body     []Node
	}
	// CallBlock is {% call(Params) Call %}Body{% endcall %}.
	CallBlock struct {
		Call     *Call
		Params   []string
		Defaults []Node
		Body     []Node
	}
	// FilterBlock is {% filter f %}Body{% endfilter %}.
	FilterBlock struct {
		Filters []*Filter
		Body    []Node
	}
	// With is {% with a = x %}Body{% endwith %}.
	With struct {
		Targets []Node
		Values  []Node
		Body    []Node
	}
	// Generation is transformers' {% generation %}Body{% endgeneration %};
	// it renders Body as is.
	Generation struct{ Body []Node }
	// Loop control: {% break %} and {% continue %}.
	Break    struct{}
	Continue struct{}
)

// Expressions.
type (
	// Const is a literal: nil, bool, int64, float64 or string.
	Const struct{ Value any }
	// Name is a variable reference.
	Name struct{ Name string }
	// Attr is X.Name.
	Attr struct {
		X    Node
		Name string
	}
	// Item is X[Index]; Index may be a *Slice.
	Item struct{ X, Index Node }
	// Slice is Start:Stop:Step inside an Item; unset parts are nil.
	Slice struct{ Start, Stop, Step Node }
	// Call is Func(Args, Kwargs).
	Call struct {
		Func   Node
		Args   []Node
		Kwargs []Kwarg
	}
	// Filter is Arg | Name(Args, Kwargs).
	Filter struct {
		Arg    Node
		Name   string
		Args   []Node
		Kwargs []Kwarg
	}
	// Test is Arg is [not] Name(Args).
	Test struct {
		Arg    Node
		Name   string
		Args   []Node
		Kwargs []Kwarg
	}
	// Unary is "not", "-" or "+" applied to X.
	Unary struct {
		Op string
		X  Node
	}
	// Binary is X Op Y for arithmetic, "~", "and", "or", "in" and "not in".
	Binary struct {
		Op   string
		X, Y Node
	}
	// Compare is X op1 Y1 op2 Y2 ...
	Compare struct {
		X   Node
		Ops []string
		Ys  []Node
	}
	// Cond is Then if Cond else Else (Else may be nil).
	Cond struct{ Cond, Then, Else Node }
	// List, Tuple and Dict are display literals.
	List  struct{ Items []Node }
	Tuple struct{ Items []Node }
	Dict  struct{ Keys, Values []Node }
)

// Kwarg is one name=value argument.
type Kwarg struct {
	Name  string
	Value Node
}

func (*Output) node()      {}
func (*If) node()          {}
func (*For) node()         {}
func (*Assign) node()      {}
func (*AssignBlock) node() {}
func (*Macro) node()       {}
func (*CallBlock) node()   {}
func (*FilterBlock) node() {}
func (*With) node()        {}
func (*Generation) node()  {}
func (*Break) node()       {}
func (*Continue) node()    {}
func (*Const) node()       {}
func (*Name) node()        {}
func (*Attr) node()        {}
func (*Item) node()        {}
func (*Slice) node()       {}
func (*Call) node()        {}
func (*Filter) node()      {}
func (*Test) node()        {}
func (*Unary) node()       {}
func (*Binary) node()      {}
func (*Compare) node()     {}
func (*Cond) node()        {}
func (*List) node()        {}
func (*Tuple) node()       {}
func (*Dict) node()        {}

// Walk calls fn for every node of the template in document order (parents
// before children); fn returning false skips the node's children.
func (t *Template) Walk(fn func(Node) bool) { walkList(t.body, fn) }

func walkList(ns []Node, fn func(Node) bool) {
	for _, n := range ns {
		walk(n, fn)
	}
}

func walkKw(kws []Kwarg, fn func(Node) bool) {
	for _, k := range kws {
		walk(k.Value, fn)
	}
}

func walk(n Node, fn func(Node) bool) {
	if n == nil || !fn(n) {
		return
	}
	switch n := n.(type) {
	case *Output:
		walk(n.Expr, fn)
	case *If:
		walk(n.Cond, fn)
		walkList(n.Body, fn)
		walkList(n.Else, fn)
	case *For:
		walk(n.Target, fn)
		walk(n.Iter, fn)
		walk(n.Filter, fn)
		walkList(n.Body, fn)
		walkList(n.Else, fn)
	case *Assign:
		walk(n.Target, fn)
		walk(n.Value, fn)
	case *AssignBlock:
		walk(n.Target, fn)
		walkList(n.Body, fn)
	case *Macro:
		walkList(n.Defaults, fn)
		walkList(n.Body, fn)
	case *CallBlock:
		walk(n.Call, fn)
		walkList(n.Defaults, fn)
		walkList(n.Body, fn)
	case *FilterBlock:
		walkList(n.Body, fn)
	case *With:
		walkList(n.Targets, fn)
		walkList(n.Values, fn)
		walkList(n.Body, fn)
	case *Generation:
		walkList(n.Body, fn)
	case *Attr:
		walk(n.X, fn)
	case *Item:
		walk(n.X, fn)
		walk(n.Index, fn)
	case *Slice:
		walk(n.Start, fn)
		walk(n.Stop, fn)
		walk(n.Step, fn)
	case *Call:
		walk(n.Func, fn)
		walkList(n.Args, fn)
		walkKw(n.Kwargs, fn)
	case *Filter:
		walk(n.Arg, fn)
		walkList(n.Args, fn)
		walkKw(n.Kwargs, fn)
	case *Test:
		walk(n.Arg, fn)
		walkList(n.Args, fn)
		walkKw(n.Kwargs, fn)
	case *Unary:
		walk(n.X, fn)
	case *Binary:
		walk(n.X, fn)
		walk(n.Y, fn)
	case *Compare:
		walk(n.X, fn)
		walkList(n.Ys, fn)
	case *Cond:
		walk(n.Cond, fn)
		walk(n.Then, fn)
		walk(n.Else, fn)
	case *List:
		walkList(n.Items, fn)
	case *Tuple:
		walkList(n.Items, fn)
	case *Dict:
		walkList(n.Keys, fn)
		walkList(n.Values, fn)
	}
}
