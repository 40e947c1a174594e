// Package chat renders a model's own chat template into the prompt text, as
// Hugging Face transformers' apply_chat_template(tokenize=False) does.
//
// Load finds a model folder's template (chat_template.jinja, or
// tokenizer_config.json's "chat_template") and its special tokens; Parse
// takes a template's source. A model without a template is ErrNoTemplate:
// there is no invented fallback format. The rendered prompt already holds
// the BOS token the template writes, so encode it without adding special
// tokens again.
//
// A *Template is immutable: Render may be called from any number of
// goroutines at once. Render neither keeps nor modifies the messages and
// options it is given. It checks ctx at each output, loop iteration and
// macro call of the template.
//
// # Rendering
//
// The environment is transformers': Jinja with trim_blocks and
// lstrip_blocks, break and continue, {% generation %} blocks that render
// their body, the tojson filter as json.dumps(x, ensure_ascii=False) (", "
// and ": " separators, keys in their order, indent, separators and
// sort_keys honoured), raise_exception(msg) (Render returns a *RaisedError,
// errors.Is ErrTemplateRaised, never a prompt), strftime_now(fmt) (Python's
// strftime on Linux, of Options.Now), and the sandbox's range limit. The
// variables are messages, add_generation_prompt, tools and documents (None
// when not given), the special tokens, and every Options.Kwargs entry
// (chat_template_kwargs: enable_thinking, reasoning_effort, ...).
//
// A tool call's function.arguments arrives from OpenAI clients as a JSON
// string; when it holds a JSON object it is decoded into a mapping before
// rendering, as vLLM does, since Qwen3, gpt-oss, GLM and others read it as
// one. A template that concatenates the arguments (+ or ~) and never tests
// their type, as DeepSeek-V3's does, gets the string.
//
// Messages are maps, so every field a client sends (reasoning_content,
// thinking, tool_call_id, name, ...) reaches the template. RenderJSON takes
// the messages as JSON and keeps each object's key order, as Python does:
// it shows wherever a template prints a mapping with tojson.
//
// # The Jinja engine
//
// Templates run on github.com/ardanlabs/jinja (v1.8.0), a Jinja engine
// without dependencies written for LLM chat templates: compiled templates
// are safe for concurrent use, and it has loop controls, namespace(),
// macros, slicing, the {% generation %} block and the string methods
// templates call. It parses every template the tests render, gpt-oss's
// harmony template included. github.com/nikolalohinski/gonja/v2 (v2.9.1)
// was the alternative: it cannot parse gpt-oss's template (a conditional
// expression in parentheses), has no {% generation %} block, brings logrus,
// json-iterator and golang.org/x/exp, and loads {% include %}d files from
// disk.
//
// Where ardanlabs/jinja differs from Jinja2, this package makes up for it
// before the engine sees the template (source.go): it lexes the template as
// Jinja2 does and hands the engine every piece of text as a string literal,
// whitespace control already applied (the engine's trimming reaches past
// {{ }} tags, knows no + and keeps a final newline); it decodes string and
// number literals as Python does; and it routes what the engine does its
// own way to Python's semantics (pyfuncs.go, pystr.go, pyjson.go): the
// tojson, title, trim, string, upper, lower, capitalize and join filters,
// the str methods (strip, split with maxsplit, rsplit, splitlines,
// startswith with a tuple, replace, upper and lower with full case mapping,
// title, join, removeprefix, find, index, count, ...), and the printing of
// values ({{ x }} prints None, 1.0 and {'a': 1} as Python's str does).
//
// What remains different, because the engine offers no hook for it:
// the operands of ~ and + print the engine's way (None as "", 1.0 as "1");
// int ** int is a float; tuples are lists; integers past int64 are floats;
// a template may append to a list (each render changes its own copies;
// Python's immutable sandbox refuses);
// where Python raises (an attribute of an undefined variable, str + dict,
// in on None) the engine often renders instead. {% include %}, {% import %},
// {% extends %}, {% with %} and {% set a, b = ... %} are syntax errors;
// filters it lacks (center, wordwrap, truncate, ...) fail the render;
// str.format is the engine's simplification. A template can still ask for
// unbounded memory ('a' * 10**12): templates are trusted as the model's
// weights are.
//
// # References
//
// The tests compare renders byte for byte with Python's jinja2 set up as
// transformers sets it up (scripts/chatref/render.py writes the fixtures in
// testdata/chat): DeepSeek-V3's, Qwen3's, Mixtral's and gpt-oss's templates
// on single and multi-turn conversations, system prompts, tool calls and
// results, reasoning content, thinking switches, non-ASCII text and
// conversations the templates reject; 600-odd renders with the templates of
// 100-odd GGUF models; and small templates for each Jinja feature.
package chat
