// Package httpjson writes the JSON answers the worker and the router share:
// a value, or an error in the shape SGLang's and OpenAI's servers give,
// {"error": {"message": ..., "code": status}}.
package httpjson

import (
	"encoding/json"
	"net/http"
)

// Write answers status with v as JSON.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// Error answers status with msg as the error's message.
func Error(w http.ResponseWriter, status int, msg string) {
	Write(w, status, map[string]any{"error": map[string]any{"message": msg, "code": status}})
}
