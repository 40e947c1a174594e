package chat_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/moex-project/moex/chat"
)

func Example() {
	// trim_blocks and lstrip_blocks are on, as in transformers: a line that
	// holds only a {% tag %} leaves nothing in the prompt.
	tmpl, err := chat.Parse(`{{ bos_token }}
{% for m in messages %}
<|im_start|>{{ m.role }}
{{ m.content | trim }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
`, map[string]any{"bos_token": "<s>"})
	if err != nil {
		panic(err)
	}
	prompt, err := tmpl.Render(context.Background(), []chat.Message{
		{"role": "system", "content": "Be brief."},
		{"role": "user", "content": " Hello! "},
	}, chat.Options{AddGenerationPrompt: true})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%q\n", prompt)
	// Output:
	// "<s>\n<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
}

func ExampleLoad() {
	dir, _ := os.MkdirTemp("", "model")
	defer os.RemoveAll(dir)
	_, err := chat.Load(dir, "")
	fmt.Println(errors.Is(err, chat.ErrNoTemplate))

	config := `{"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>",
		"chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"}`
	_ = os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(config), 0o644)
	tmpl, err := chat.Load(dir, "")
	if err != nil {
		panic(err)
	}
	prompt, _ := tmpl.Render(context.Background(), []chat.Message{{"role": "user", "content": "hi"}}, chat.Options{})
	fmt.Println(prompt)
	// Output:
	// true
	// <s>[user] hi
}

// RenderJSON takes an OpenAI request's messages as they came: the tool
// call's arguments, a JSON string, reach the template as a mapping.
func ExampleTemplate_RenderJSON() {
	tmpl, _ := chat.Parse(`{% for m in messages %}{% for c in m.tool_calls %}
{{- c.function.name }}({% for k, v in c.function.arguments|items %}{{ k }}={{ v|tojson }}{% endfor %})
{%- endfor %}{% endfor %}`, nil)
	prompt, err := tmpl.RenderJSON(context.Background(), []byte(`[{"role": "assistant", "content": null,
		"tool_calls": [{"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}]}]`),
		chat.Options{})
	fmt.Println(prompt, err)
	// Output: get_weather(city="Zürich") <nil>
}

func ExampleRaisedError() {
	tmpl, _ := chat.Parse(`{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok`, nil)
	_, err := tmpl.Render(context.Background(), []chat.Message{{"role": "assistant", "content": "hi"}}, chat.Options{})
	var raised *chat.RaisedError
	if errors.As(err, &raised) {
		fmt.Println("400 Bad Request:", raised.Message)
	}
	// Output: 400 Bad Request: Conversations must start with a user message
}
