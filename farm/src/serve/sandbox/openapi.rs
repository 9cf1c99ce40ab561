//! The OpenAPI 3.1 document of the sandbox API (`GET /v1/openapi.json`). The prose
//! reference is `docs/sandbox-api.md`; a test checks every route the service serves is here.

use serde_json::{json, Value};

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn body(name: &str) -> Value {
    json!({ "required": true, "content": { "application/json": { "schema": reference(name) } } })
}

fn answer(status: &str, what: &str, name: &str) -> Value {
    json!({
        status: { "description": what, "content": { "application/json": { "schema": reference(name) } } },
        "4XX": { "description": "a bad request: the error names the field", "content": { "application/json": { "schema": reference("Error") } } },
        "5XX": { "description": "farm failed (the error says what)", "content": { "application/json": { "schema": reference("Error") } } },
    })
}

fn id_parameter() -> Value {
    json!([{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }])
}

fn path_parameters(with_mode: bool) -> Value {
    let mut params = vec![
        json!({ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }),
        json!({ "name": "path", "in": "query", "required": true, "description": "an absolute guest path", "schema": { "type": "string" } }),
    ];
    if with_mode {
        params.push(json!({ "name": "mode", "in": "query", "description": "octal file mode (default 644)", "schema": { "type": "string" } }));
    }
    Value::Array(params)
}

fn raw(content_type: &str) -> Value {
    json!({ "required": true, "content": { content_type: { "schema": { "type": "string", "format": "binary" } } } })
}

fn raw_answer(content_type: &str, what: &str) -> Value {
    json!({
        "200": { "description": what, "content": { content_type: { "schema": { "type": "string", "format": "binary" } } } },
        "4XX": { "description": "a bad request, no such file (404) or too large (413)", "content": { "application/json": { "schema": reference("Error") } } },
    })
}

// Long: one literal document (the OpenAPI JSON in one `json!`), read as the document it is;
// cut into pieces it would no longer read as one.
/// The document.
pub fn document() -> Value {
    let strings = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "farm serve: the sandbox API",
            "version": "1",
            "description": "Environments built on demand and sandboxes forked from them. See docs/sandbox-api.md.",
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Error": { "type": "object", "required": ["error"], "properties": {
                    "error": { "type": "string" }, "field": { "type": "string" } } },
                "Context": { "type": "object", "properties": {
                    "context": { "type": "string" }, "files": { "type": "integer" }, "bytes": { "type": "integer" } } },
                "EnvironmentRequest": { "type": "object", "additionalProperties": false, "properties": {
                    "image": { "type": "string", "description": "minimal, python, or a registry reference" },
                    "dockerfile": { "type": "object", "additionalProperties": false, "required": ["context"], "properties": {
                        "context": { "type": "string" }, "path": { "type": "string", "default": "Dockerfile" },
                        "build_args": strings, "target": { "type": "string" } } },
                    "cpus": { "type": "integer", "minimum": 1, "maximum": 64, "default": 1 },
                    "memory_mib": { "type": "integer", "minimum": 128, "default": 512 },
                    "disk_mib": { "type": "integer", "minimum": 64 },
                    "setup": { "type": "array", "items": { "type": "string" } },
                    "force": { "type": "boolean", "default": false } } },
                "Environment": { "type": "object", "properties": {
                    "id": { "type": "string" },
                    "state": { "enum": ["building", "ready", "failed"] },
                    "spec": { "type": "object" },
                    "cpus": { "type": "integer" }, "memory_mib": { "type": "integer" },
                    "created_at_ms": { "type": "integer" }, "log_lines": { "type": "integer" },
                    "snapshot": { "type": ["string", "null"] },
                    "error": { "type": ["object", "null"], "properties": {
                        "message": { "type": "string" }, "dockerfile_line": { "type": "integer" },
                        "instruction": { "type": "string" }, "output_tail": { "type": "string" } } },
                    "sandboxes": { "type": "integer" }, "warm": { "type": "integer" } } },
                "Logs": { "type": "object", "properties": {
                    "lines": { "type": "array", "items": { "type": "string" } }, "next": { "type": "integer" },
                    "state": { "enum": ["building", "ready", "failed"] }, "error": { "type": ["object", "null"] } } },
                "SandboxRequest": { "type": "object", "additionalProperties": false, "required": ["environment"], "properties": {
                    "environment": { "type": "string" }, "env": strings,
                    "workdir": { "type": "string" }, "user": { "type": "string" },
                    "network": { "type": ["string", "null"], "description": "a policy of serve.sandboxes.networks" },
                    "disk_mib": { "type": "integer", "minimum": 1 },
                    "idle_timeout_secs": { "type": "integer", "minimum": 1 },
                    "lifetime_secs": { "type": "integer", "minimum": 1 },
                    "cpus": { "type": "integer" }, "memory_mib": { "type": "integer" },
                    "metadata": strings } },
                "Sandbox": { "type": "object", "properties": {
                    "id": { "type": "string" }, "environment": { "type": "string" },
                    "state": { "enum": ["running", "paused"] },
                    "cpus": { "type": "integer" }, "memory_mib": { "type": "integer" },
                    "network": { "type": ["string", "null"] }, "workdir": { "type": ["string", "null"] },
                    "user": { "type": ["string", "null"] }, "created_at_ms": { "type": "integer" },
                    "expires_at_ms": { "type": "integer" }, "idle_timeout_secs": { "type": "integer" },
                    "parent": { "type": ["string", "null"] }, "metadata": strings } },
                "ExecRequest": { "type": "object", "additionalProperties": false, "properties": {
                    "command": { "type": "string", "description": "a shell string (/bin/sh -c)" },
                    "argv": { "type": "array", "items": { "type": "string" } },
                    "cwd": { "type": "string" }, "env": strings, "user": { "type": "string" },
                    "timeout_secs": { "type": "number", "default": 600, "maximum": 86400 },
                    "stdin": { "type": "string" },
                    "max_output_bytes": { "type": "integer", "minimum": 1, "maximum": 16_777_216 } } },
                "ExecResult": { "type": "object", "properties": {
                    "exit_code": { "type": ["integer", "null"] }, "signal": { "type": ["integer", "null"] },
                    "timed_out": { "type": "boolean" }, "stdout": { "type": "string" }, "stderr": { "type": "string" },
                    "stdout_truncated": { "type": "boolean" }, "stderr_truncated": { "type": "boolean" },
                    "output_cap_bytes": { "type": "integer" }, "duration_ms": { "type": "integer" } } },
                "Written": { "type": "object", "properties": { "path": { "type": "string" }, "bytes": { "type": "integer" } } },
                "Deleted": { "type": "object", "properties": { "id": { "type": "string" }, "deleted": { "type": "boolean" } } },
                "EnvironmentList": { "type": "object", "properties": { "environments": { "type": "array", "items": reference("Environment") } } },
                "SandboxList": { "type": "object", "properties": { "sandboxes": { "type": "array", "items": reference("Sandbox") } } },
            },
        },
        "security": [{ "bearer": [] }],
        "paths": {
            "/v1/contexts": { "post": {
                "summary": "Upload a Dockerfile build context (a tar archive of regular files and folders)",
                "requestBody": raw("application/x-tar"), "responses": answer("201", "the context", "Context") } },
            "/v1/environments": {
                "post": { "summary": "Create (or find) an environment; 202 while it builds",
                    "requestBody": body("EnvironmentRequest"), "responses": answer("202", "the environment", "Environment") },
                "get": { "summary": "List environments", "responses": answer("200", "the environments", "EnvironmentList") } },
            "/v1/environments/{id}": {
                "parameters": id_parameter(),
                "get": { "summary": "An environment", "responses": answer("200", "the environment", "Environment") },
                "delete": { "summary": "Forget an environment (its snapshot goes at the next farm snapshot gc)",
                    "responses": answer("200", "deleted", "Deleted") } },
            "/v1/environments/{id}/logs": { "get": {
                "summary": "Build progress from a line on, waiting up to `wait` seconds for more",
                "parameters": [
                    { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } },
                    { "name": "offset", "in": "query", "schema": { "type": "integer", "default": 0 } },
                    { "name": "wait", "in": "query", "schema": { "type": "number", "default": 0, "maximum": 300 } } ],
                "responses": answer("200", "lines", "Logs") } },
            "/v1/sandboxes": {
                "post": { "summary": "Create a sandbox (Idempotency-Key makes a retry answer with the same one)",
                    "parameters": [{ "name": "Idempotency-Key", "in": "header", "schema": { "type": "string" } }],
                    "requestBody": body("SandboxRequest"), "responses": answer("201", "the sandbox", "Sandbox") },
                "get": { "summary": "List sandboxes", "responses": answer("200", "the sandboxes", "SandboxList") } },
            "/v1/sandboxes/{id}": {
                "parameters": id_parameter(),
                "get": { "summary": "A sandbox", "responses": answer("200", "the sandbox", "Sandbox") },
                "delete": { "summary": "Remove a sandbox (its VM stops)", "responses": answer("200", "deleted", "Deleted") } },
            "/v1/sandboxes/{id}/exec": { "post": {
                "summary": "Run a command and answer with its output", "parameters": id_parameter(),
                "requestBody": body("ExecRequest"), "responses": answer("200", "how it ended", "ExecResult") } },
            "/v1/sandboxes/{id}/exec/stream": { "post": {
                "summary": "Run a command; output as server-sent events (stdout, stderr, then exit or error)",
                "parameters": id_parameter(), "requestBody": body("ExecRequest"),
                "responses": { "200": { "description": "events", "content": { "text/event-stream": { "schema": { "type": "string" } } } } } } },
            "/v1/sandboxes/{id}/files": {
                "put": { "summary": "Write a file (parents made)", "parameters": path_parameters(true),
                    "requestBody": raw("application/octet-stream"), "responses": answer("200", "written", "Written") },
                "get": { "summary": "Read a file", "parameters": path_parameters(false),
                    "responses": raw_answer("application/octet-stream", "the file") } },
            "/v1/sandboxes/{id}/folders": {
                "put": { "summary": "Unpack a tar archive in the guest under path", "parameters": path_parameters(false),
                    "requestBody": raw("application/x-tar"), "responses": answer("200", "unpacked", "Written") },
                "get": { "summary": "A tar archive of a guest folder", "parameters": path_parameters(false),
                    "responses": raw_answer("application/x-tar", "the archive") } },
            "/v1/sandboxes/{id}/branch": { "post": {
                "summary": "A new sandbox continuing from this one's state", "parameters": id_parameter(),
                "responses": answer("201", "the new sandbox", "Sandbox") } },
            "/v1/sandboxes/{id}/pause": { "post": {
                "summary": "Save to disk and stop the VM", "parameters": id_parameter(),
                "responses": answer("200", "the sandbox", "Sandbox") } },
            "/v1/sandboxes/{id}/resume": { "post": {
                "summary": "Fork again from the saved state", "parameters": id_parameter(),
                "responses": answer("200", "the sandbox", "Sandbox") } },
            "/v1/sandboxes/{id}/snapshot": { "post": {
                "summary": "A new ready environment of this sandbox's state", "parameters": id_parameter(),
                "responses": answer("201", "the environment", "Environment") } },
            "/v1/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3.1" } } } },
        },
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_schema_referred_to_is_defined() {
        let doc = super::document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("#/components/schemas/").skip(1) {
            let name: String = part.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            assert!(schemas.contains_key(&name), "{name} is referred to but not defined");
        }
        // The routes of the sandbox API, as the router has them.
        let source = include_str!("../sandbox_routes.rs");
        for line in source.lines().filter(|l| l.trim_start().starts_with(".route(\"")) {
            let path = line.split('"').nth(1).unwrap();
            assert!(
                doc["paths"].get(path).is_some(),
                "{path} is served but not in the document"
            );
        }
    }
}
