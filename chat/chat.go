package chat

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

var (
	// ErrNoTemplate: the model ships no chat template (or none of the name
	// asked for). A chat request to it is an error; there is no made-up
	// format to fall back on.
	ErrNoTemplate = errors.New("chat: no chat template")

	// ErrTemplateRaised: the template called raise_exception, rejecting the
	// conversation (a role it does not know, roles out of order, ...).
	// The error is a *RaisedError carrying the template's message.
	ErrTemplateRaised = errors.New("chat: the template rejected the conversation")
)

// RaisedError is the error Render returns when the template calls
// raise_exception(message); errors.Is(err, ErrTemplateRaised) holds.
type RaisedError struct {
	Message string
}

func (e *RaisedError) Error() string { return ErrTemplateRaised.Error() + ": " + e.Message }

// Is reports target == ErrTemplateRaised.
func (e *RaisedError) Is(target error) bool { return target == ErrTemplateRaised }

// Message is one chat message as the template sees it: "role", "content" (a
// string, a list of parts, or nil), and every other field the caller sends
// ("tool_calls", "tool_call_id", "name", "reasoning_content", "thinking",
// ...). Values are converted as described for Options.Tools.
type Message map[string]any

// Options are what a render passes besides the messages.
type Options struct {
	// AddGenerationPrompt ends the prompt with the assistant turn's header.
	AddGenerationPrompt bool
	// Tools are the tool schemas (the template's tools; None when nil).
	// Each value anywhere in Tools, Documents, Kwargs and messages may be
	// a json.RawMessage, decoded keeping its keys' order (as Python keeps a
	// request's), or plain Go values: nil, bool, numbers, strings, slices,
	// maps with string keys (keys in sorted order), json.Number; other
	// types go through encoding/json. A whole float64 is read as an int,
	// since encoding/json decodes every JSON number into float64.
	Tools []any
	// Documents are the template's documents (None when nil).
	Documents []any
	// Kwargs are further template variables: chat_template_kwargs such as
	// enable_thinking, reasoning_effort. They override special tokens of
	// the same name; messages, tools, documents and add_generation_prompt
	// cannot be set here.
	Kwargs map[string]any
	// Now is the time strftime_now formats; nil means time.Now.
	Now func() time.Time
}

// Template is a model's chat template, parsed once. Render may be called
// from several goroutines at once.
type Template struct {
	tmpl              *jinja.Template
	vars              map[string]jinja.Value
	argumentsAsString bool
}

// Parse parses src, a Jinja chat template, with the variables every render
// sees: the special tokens (bos_token, eos_token, ... as strings,
// additional_special_tokens as a list of them). A syntax error's message
// names the line (a *SyntaxError where the line is known).
func Parse(src string, specials map[string]any) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("chat: template: %v", r)
		}
	}()
	prep, err := prepare(src)
	if err != nil {
		return nil, err
	}
	tmpl, err := jinja.Compile(prep.text)
	if err != nil {
		return nil, fmt.Errorf("chat: template: %w", err)
	}
	vars := make(map[string]jinja.Value, len(specials))
	for k, v := range specials {
		if strings.HasPrefix(k, internalPrefix) {
			return nil, fmt.Errorf("chat: special token name %q is reserved", k)
		}
		jv, err := toValue(v)
		if err != nil {
			return nil, fmt.Errorf("chat: special token %q: %w", k, err)
		}
		vars[k] = jv
	}
	return &Template{tmpl: tmpl, vars: vars, argumentsAsString: prep.argumentsAsString}, nil
}

// Render renders the conversation as transformers' apply_chat_template
// does (tokenize=False). A tool call's function.arguments that is a JSON
// object in a string (OpenAI's form) is decoded first, as vLLM does, unless
// the template concatenates the arguments as a string and never tests their
// type (DeepSeek-V3's template): that one gets the string. A template's
// raise_exception returns a *RaisedError; ctx is checked at each output,
// loop iteration and macro call.
func (t *Template) Render(ctx context.Context, messages []Message, opt Options) (string, error) {
	items := make([]jinja.Value, len(messages))
	for i, m := range messages {
		v, err := mapValue(m, 0)
		if err != nil {
			return "", fmt.Errorf("chat: message %d: %w", i, err)
		}
		items[i] = v
	}
	return t.render(ctx, jinja.NewList(items), opt)
}

// RenderJSON is Render with the messages as a JSON array (OpenAI's
// "messages"), each object keeping its keys' order.
func (t *Template) RenderJSON(ctx context.Context, messages []byte, opt Options) (string, error) {
	v, err := decodeJSON(messages)
	if err != nil {
		return "", fmt.Errorf("chat: messages: %w", err)
	}
	if !v.IsList() {
		return "", fmt.Errorf("chat: messages: not a JSON array")
	}
	return t.render(ctx, v, opt)
}

// reserved are the variables Render sets itself.
var reserved = map[string]bool{"messages": true, "tools": true, "documents": true, "add_generation_prompt": true}

// staticFuncs are the internal functions the prepared source calls that
// need no render's state.
var staticFuncs = func() map[string]jinja.Value {
	m := make(map[string]jinja.Value)
	for name, f := range filters {
		m[filterPrefix+name] = jinja.NewCallable(name, f)
	}
	for name, f := range strMethods {
		m[methodPrefix+name] = jinja.NewCallable("str."+name, methodCall(name, f))
	}
	return m
}()

// maxMacroDepth bounds nested macro calls: a template that recurses
// without end fails instead of exhausting the stack (Python stops at its
// recursion limit).
const maxMacroDepth = 500

// render holds one render's state for the functions it calls.
type render struct {
	ctx    context.Context
	now    func() time.Time
	raised *RaisedError
	depth  int
}

func (t *Template) render(ctx context.Context, messages jinja.Value, opt Options) (out string, err error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat: render: %v", r)
		}
	}()
	if !t.argumentsAsString {
		decodeToolArguments(messages)
	}
	r := &render{ctx: ctx, now: opt.Now}
	if r.now == nil {
		r.now = time.Now
	}
	data := make(map[string]jinja.Value, 8+len(t.vars)+len(opt.Kwargs)+len(staticFuncs))
	// Globals, which variables of the same name shadow as in Jinja.
	data["raise_exception"] = jinja.NewCallable("raise_exception", r.raise)
	data["strftime_now"] = jinja.NewCallable("strftime_now", r.strftimeNow)
	data["range"] = jinja.NewCallable("range", r.checked(safeRange))
	for k, v := range t.vars {
		data[k] = copyValue(v) // a template may append to a list
	}
	for k, v := range opt.Kwargs {
		if reserved[k] || strings.HasPrefix(k, internalPrefix) {
			return "", fmt.Errorf("chat: Kwargs may not set %q", k)
		}
		jv, err := toValue(v)
		if err != nil {
			return "", fmt.Errorf("chat: Kwargs[%q]: %w", k, err)
		}
		data[k] = jv
	}
	data["messages"] = messages
	data["add_generation_prompt"] = jinja.NewBool(opt.AddGenerationPrompt)
	for name, list := range map[string][]any{"tools": opt.Tools, "documents": opt.Documents} {
		v := jinja.None()
		if list != nil {
			if v, err = toValue(list); err != nil {
				return "", fmt.Errorf("chat: %s: %w", name, err)
			}
		}
		data[name] = v
	}
	for k, v := range staticFuncs {
		data[k] = v
	}
	data[printFunc] = jinja.NewCallable("print", r.checked(func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.NewString(""), nil
		}
		return jinja.NewString(pyStr(args[0])), nil
	}))

	data[tickFunc] = jinja.NewCallable("tick", r.checked(none))
	data[enterFunc] = jinja.NewCallable("enter", func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		if r.depth++; r.depth > maxMacroDepth {
			return jinja.Undefined(), fmt.Errorf("macro calls nested deeper than %d", maxMacroDepth)
		}
		return r.checked(none)(nil, nil)
	})
	data[leaveFunc] = jinja.NewCallable("leave", func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		r.depth--
		return jinja.NewString(""), nil
	})

	out, err = t.tmpl.RenderValues(data)
	if r.raised != nil {
		return "", r.raised
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
		return "", fmt.Errorf("chat: render: %w", err)
	}
	return out, nil
}

// none returns nothing to print.
func none([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return jinja.NewString(""), nil
}

// checked wraps f to stop the render once ctx is done.
func (r *render) checked(f fn) fn {
	return func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if err := r.ctx.Err(); err != nil {
			return jinja.Undefined(), err
		}
		return f(args, kwargs)
	}
}

// raise is raise_exception(message).
func (r *render) raise(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	msg := arg(args, kwargs, 0, "message")
	r.raised = &RaisedError{Message: pyStr(msg)}
	return jinja.Undefined(), r.raised
}

// strftimeNow is strftime_now(format).
func (r *render) strftimeNow(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if err := r.ctx.Err(); err != nil {
		return jinja.Undefined(), err
	}
	f := arg(args, kwargs, 0, "format")
	if !f.IsString() {
		return jinja.Undefined(), fmt.Errorf("strftime_now: format must be a string, not %s", typeName(f))
	}
	return jinja.NewString(strftime(r.now(), f.AsString())), nil
}
