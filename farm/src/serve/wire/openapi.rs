//! The OpenAPI 3.1 document of `farm serve`, generated from the wire types: each route says
//! which request type it takes and which answer type it gives, and their schemas are the
//! types' own (`utoipa::ToSchema`), so a field added to a type is in the document. A test
//! checks every route the router serves is here; `docs/openapi.json` is this document as
//! committed, and the SDK's models are checked against it.

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem, PathsBuilder};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ComponentsBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{Content, InfoBuilder, OpenApiBuilder, Ref, RefOr, Required};
use utoipa::ToSchema;

use super::*;
use crate::serve::requests::{
    CancelBelow, ExecRequest as SessionExec, ItemRequest, SubmitRequest, SubmitSessionRequest, WriteFileRequest,
};
use crate::serve::sandbox::contexts::Uploaded;
use crate::serve::sandbox::environments::EnvironmentRequest;
use crate::serve::sandbox::sandboxes::{ExecRequest as SandboxExec, SandboxRequest};
use engine::guest::CommandOutput;

/// What a route takes or gives.
enum Body {
    /// JSON of a wire type's schema.
    Json(Box<Content>),
    /// Bytes of a media type (a tar archive, a file, a stream of events).
    Raw(&'static str),
}

/// The document being made: its paths, and the schemas they refer to.
struct Doc {
    paths: PathsBuilder,
    schemas: Vec<(String, RefOr<Schema>)>,
}

impl Doc {
    /// JSON of `T`, its schema (and the ones it refers to) added to the components.
    fn json<T: ToSchema>(&mut self) -> Body {
        let (name, schema) = (T::name().into_owned(), T::schema());
        // Two types of one name would share a schema in the document: refuse it.
        if let Some((_, seen)) = self.schemas.iter().find(|(n, _)| *n == name) {
            assert!(
                *seen == schema,
                "two wire types are named {name}: give one #[schema(as = ...)]"
            );
        }
        self.schemas.push((name, schema));
        T::schemas(&mut self.schemas);
        Body::Json(Box::new(
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(T::name())))
                .build(),
        ))
    }

    // Long: one route's operation (parameters, body, answers and the errors every route
    // shares), built in one place so every route reads the same.
    fn route(
        &mut self,
        method: HttpMethod,
        path: &str,
        summary: &str,
        query: &[(&str, &str)],
        request: Option<Body>,
        answers: Vec<(&str, &str, Body)>,
    ) {
        let mut operation = OperationBuilder::new().summary(Some(summary));
        if path.contains("{id}") {
            operation = operation.parameter(
                ParameterBuilder::new()
                    .name("id")
                    .parameter_in(ParameterIn::Path)
                    .required(Required::True)
                    .schema(Some(ObjectBuilder::new().schema_type(Type::String))),
            );
        }
        for (name, description) in query {
            operation = operation.parameter(
                ParameterBuilder::new()
                    .name(*name)
                    .parameter_in(ParameterIn::Query)
                    .description(Some(*description))
                    .schema(Some(ObjectBuilder::new().schema_type(Type::String))),
            );
        }
        if let Some(body) = request {
            let (media, content) = content(body);
            operation = operation.request_body(Some(
                RequestBodyBuilder::new()
                    .required(Some(Required::True))
                    .content(media, content)
                    .build(),
            ));
        }
        for (status, description, body) in answers {
            let (media, content) = content(body);
            operation = operation.response(
                status,
                ResponseBuilder::new().description(description).content(media, content),
            );
        }
        let error = ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(ErrorBody::name())))
            .build();
        operation = operation
            .response(
                "4XX",
                ResponseBuilder::new()
                    .description("refused: the error names the field")
                    .content("application/json", error.clone()),
            )
            .response(
                "5XX",
                ResponseBuilder::new()
                    .description("farm failed (the error says what)")
                    .content("application/json", error),
            );
        let paths = std::mem::take(&mut self.paths);
        self.paths = paths.path(path, PathItem::new(method, operation.build()));
    }
}

fn content(body: Body) -> (&'static str, Content) {
    match body {
        Body::Json(content) => ("application/json", *content),
        Body::Raw(media) => (
            media,
            ContentBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String).format(Some(
                    utoipa::openapi::schema::SchemaFormat::KnownFormat(utoipa::openapi::schema::KnownFormat::Binary),
                ))))
                .build(),
        ),
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = Doc {
        paths: PathsBuilder::new(),
        schemas: Vec::new(),
    };
    doc.json::<ErrorBody>();
    rollout_routes(&mut doc);
    session_routes(&mut doc);
    session_state_routes(&mut doc);
    environment_routes(&mut doc);
    sandbox_routes(&mut doc);
    sandbox_state_routes(&mut doc);
    file_routes(&mut doc);
    protocol_routes(&mut doc);
    let info = InfoBuilder::new()
        .title("farm serve")
        .version("1")
        .description(Some(
            "Rollouts and their rows, live sessions, and the sandbox API (environments and sandboxes). \
             See the README's API reference and docs/sandbox-api.md.",
        ))
        .build();
    OpenApiBuilder::new()
        .info(info)
        .paths(doc.paths.build())
        .components(Some(ComponentsBuilder::new().schemas_from_iter(doc.schemas).build()))
        .build()
}

fn rollout_routes(doc: &mut Doc) {
    use HttpMethod::{Get, Post};
    let (body, answer) = (doc.json::<SubmitRequest>(), doc.json::<Submitted>());
    doc.route(
        Post,
        "/v1/rollouts",
        "submit rollouts (header Idempotency-Key: a retry gets the same answer)",
        &[],
        Some(body),
        vec![("202", "admitted", answer)],
    );
    let query = [
        ("cursor", "the first row's cursor (default 0)"),
        ("max", "rows at most (1-10000, default 100)"),
        ("wait", "seconds to wait for a first row (0-300)"),
    ];
    doc.route(Get, "/v1/results", "rows from a cursor on: NDJSON, or Arrow IPC with Accept: application/vnd.apache.arrow.stream (header farm-next-cursor)", &query, None, vec![("200", "rows", Body::Raw("application/x-ndjson"))]);
    let answer = doc.json::<RolloutView>();
    doc.route(
        Get,
        "/v1/rollouts/{id}",
        "one rollout, and its row once done",
        &[],
        None,
        vec![("200", "the rollout", answer)],
    );
    let answer = doc.json::<Cancelled>();
    doc.route(
        Post,
        "/v1/rollouts/{id}/cancel",
        "cancel a queued or running rollout",
        &[],
        None,
        vec![("200", "cancelled or not", answer)],
    );
    let (body, answer) = (doc.json::<CancelBelow>(), doc.json::<CancelledCount>());
    doc.route(
        Post,
        "/v1/cancel",
        "cancel rollouts of policy versions below one",
        &[],
        Some(body),
        vec![("200", "how many", answer)],
    );
    let answer = doc.json::<Capacity>();
    doc.route(
        Get,
        "/v1/capacity",
        "slots, queue, sessions, sandboxes and memory",
        &[],
        None,
        vec![("200", "the capacity", answer)],
    );
    doc.route(
        Get,
        "/metrics",
        "Prometheus metrics",
        &[],
        None,
        vec![("200", "the metrics", Body::Raw("text/plain"))],
    );
}

fn session_routes(doc: &mut Doc) {
    use HttpMethod::{Get, Post};
    let (body, answer) = (doc.json::<ItemRequest>(), doc.json::<SessionOpened>());
    doc.route(
        Post,
        "/v1/sessions",
        "open a session on a task",
        &[],
        Some(body),
        vec![("201", "opened", answer)],
    );
    let answer = doc.json::<SessionList>();
    doc.route(
        Get,
        "/v1/sessions",
        "every live and paused session",
        &[],
        None,
        vec![("200", "the sessions", answer)],
    );
    let (body, answer) = (doc.json::<SessionExec>(), doc.json::<Stepped>());
    doc.route(
        Post,
        "/v1/sessions/{id}/exec",
        "run a command as the session's next step",
        &[],
        Some(body),
        vec![("200", "the step", answer)],
    );
    let (body, answer) = (doc.json::<WriteFileRequest>(), doc.json::<Stepped>());
    doc.route(
        Post,
        "/v1/sessions/{id}/write_file",
        "write a file as the session's next step",
        &[],
        Some(body),
        vec![("200", "the step", answer)],
    );
    let answer = doc.json::<Branched>();
    doc.route(
        Post,
        "/v1/sessions/{id}/branch",
        "a new session from this one's state",
        &[],
        None,
        vec![("201", "the branch", answer)],
    );
    let (body, answer) = (doc.json::<SubmitSessionRequest>(), doc.json::<SessionScored>());
    doc.route(
        Post,
        "/v1/sessions/{id}/submit",
        "end and score the session",
        &[],
        Some(body),
        vec![("200", "the verdict", answer)],
    );
}

fn session_state_routes(doc: &mut Doc) {
    use HttpMethod::{Delete, Get, Post};
    for (path, summary) in [
        ("/v1/sessions/{id}/pause", "save the session to disk and stop its VM"),
        ("/v1/sessions/{id}/resume", "fork a paused session again"),
    ] {
        let answer = doc.json::<SessionView>();
        doc.route(Post, path, summary, &[], None, vec![("200", "the session", answer)]);
    }
    let answer = doc.json::<SessionView>();
    doc.route(
        Get,
        "/v1/sessions/{id}",
        "one session",
        &[],
        None,
        vec![("200", "the session", answer)],
    );
    let answer = doc.json::<SessionEnded>();
    doc.route(
        Delete,
        "/v1/sessions/{id}",
        "end a session without a row",
        &[],
        None,
        vec![("200", "ended", answer)],
    );
}

fn environment_routes(doc: &mut Doc) {
    use HttpMethod::{Delete, Get, Post};
    let answer = doc.json::<Uploaded>();
    doc.route(
        Post,
        "/v1/contexts",
        "upload a Dockerfile build context (a tar archive)",
        &[],
        Some(Body::Raw("application/x-tar")),
        vec![("201", "the context", answer)],
    );
    let (body, accepted, existing) = (
        doc.json::<EnvironmentRequest>(),
        doc.json::<EnvironmentView>(),
        doc.json::<EnvironmentView>(),
    );
    doc.route(
        Post,
        "/v1/environments",
        "make an environment (or find the one with the same content)",
        &[],
        Some(body),
        vec![("202", "building", accepted), ("200", "it exists", existing)],
    );
    let answer = doc.json::<EnvironmentList>();
    doc.route(
        Get,
        "/v1/environments",
        "every environment",
        &[],
        None,
        vec![("200", "the environments", answer)],
    );
    let answer = doc.json::<EnvironmentView>();
    doc.route(
        Get,
        "/v1/environments/{id}",
        "one environment",
        &[],
        None,
        vec![("200", "the environment", answer)],
    );
    let answer = doc.json::<Deleted>();
    doc.route(
        Delete,
        "/v1/environments/{id}",
        "delete an environment",
        &[],
        None,
        vec![("200", "deleted", answer)],
    );
    let query = [
        ("offset", "the first line (default 0)"),
        ("wait", "seconds to wait for a line (0-300)"),
    ];
    let answer = doc.json::<LogPage>();
    doc.route(
        Get,
        "/v1/environments/{id}/logs",
        "an environment's build lines",
        &query,
        None,
        vec![("200", "lines", answer)],
    );
}

fn sandbox_routes(doc: &mut Doc) {
    use HttpMethod::{Delete, Get, Post};
    let (body, made, retried) = (
        doc.json::<SandboxRequest>(),
        doc.json::<SandboxView>(),
        doc.json::<SandboxView>(),
    );
    doc.route(
        Post,
        "/v1/sandboxes",
        "fork a sandbox of an environment (header Idempotency-Key)",
        &[],
        Some(body),
        vec![("201", "made", made), ("200", "a retried create", retried)],
    );
    let answer = doc.json::<SandboxList>();
    doc.route(
        Get,
        "/v1/sandboxes",
        "every sandbox",
        &[],
        None,
        vec![("200", "the sandboxes", answer)],
    );
    let answer = doc.json::<SandboxView>();
    doc.route(
        Get,
        "/v1/sandboxes/{id}",
        "one sandbox",
        &[],
        None,
        vec![("200", "the sandbox", answer)],
    );
    let answer = doc.json::<Deleted>();
    doc.route(
        Delete,
        "/v1/sandboxes/{id}",
        "delete a sandbox (its VM stops now)",
        &[],
        None,
        vec![("200", "deleted", answer)],
    );
    let (body, answer) = (doc.json::<SandboxExec>(), doc.json::<CommandOutput>());
    doc.route(
        Post,
        "/v1/sandboxes/{id}/exec",
        "run a command",
        &[],
        Some(body),
        vec![("200", "how it ended", answer)],
    );
}

fn sandbox_state_routes(doc: &mut Doc) {
    use HttpMethod::Post;
    let body = doc.json::<SandboxExec>();
    doc.json::<StreamData>();
    doc.json::<StreamError>();
    doc.json::<engine::guest::CommandEnd>();
    doc.route(Post, "/v1/sandboxes/{id}/exec/stream", "run a command, its output as server-sent events (stdout, stderr: StreamData; exit: CommandEnd; error: StreamError)", &[], Some(body), vec![("200", "events", Body::Raw("text/event-stream"))]);
    for (path, summary, status) in [
        (
            "/v1/sandboxes/{id}/branch",
            "a new sandbox from this one's state",
            "201",
        ),
        ("/v1/sandboxes/{id}/pause", "save it to disk and stop its VM", "200"),
        ("/v1/sandboxes/{id}/resume", "fork it again from its saved state", "200"),
    ] {
        let answer = doc.json::<SandboxView>();
        doc.route(Post, path, summary, &[], None, vec![(status, "the sandbox", answer)]);
    }
    let answer = doc.json::<EnvironmentView>();
    doc.route(
        Post,
        "/v1/sandboxes/{id}/snapshot",
        "a new environment of this sandbox's state",
        &[],
        None,
        vec![("201", "the environment", answer)],
    );
}

fn file_routes(doc: &mut Doc) {
    use HttpMethod::{Get, Put};
    let path_query = [
        ("path", "an absolute guest path"),
        ("mode", "octal file mode (default 644)"),
    ];
    for (path, media) in [
        ("/v1/sandboxes/{id}/files", "application/octet-stream"),
        ("/v1/sandboxes/{id}/folders", "application/x-tar"),
    ] {
        let written = doc.json::<FileWritten>();
        doc.route(
            Put,
            path,
            "upload (a folder as a tar archive)",
            &path_query,
            Some(Body::Raw(media)),
            vec![("200", "written", written)],
        );
        doc.route(
            Get,
            path,
            "download (a folder as a tar archive)",
            &path_query[..1],
            None,
            vec![("200", "the bytes", Body::Raw(media))],
        );
    }
    doc.route(
        Get,
        "/v1/openapi.json",
        "this document",
        &[],
        None,
        vec![("200", "the document", Body::Raw("application/json"))],
    );
}

/// Routes whose messages other clients define: OpenEnv's and MCP's.
fn protocol_routes(doc: &mut Doc) {
    use HttpMethod::{Get, Post};
    let message = || Body::Raw("application/json");
    doc.route(
        Post,
        "/v1/sessions/{id}/mcp",
        "MCP (JSON-RPC 2.0 over HTTP POST) for the agent in a session",
        &[],
        Some(message()),
        vec![("200", "a JSON-RPC answer", message())],
    );
    doc.route(
        Get,
        "/v1/openenv/health",
        "OpenEnv: health",
        &[],
        None,
        vec![("200", "healthy", message())],
    );
    doc.route(
        Get,
        "/v1/openenv/metadata",
        "OpenEnv: the environment's metadata",
        &[],
        None,
        vec![("200", "metadata", message())],
    );
    doc.route(
        Get,
        "/v1/openenv/schema",
        "OpenEnv: action and observation schemas",
        &[],
        None,
        vec![("200", "schemas", message())],
    );
    doc.route(
        Get,
        "/v1/openenv/ws",
        "OpenEnv: an episode over a WebSocket (reset, step, state, close)",
        &[],
        None,
        vec![("101", "switching to the WebSocket", message())],
    );
}

/// The document as pretty JSON text (what `farm openapi` prints, and `docs/openapi.json`).
pub fn json() -> String {
    serde_json::to_string_pretty(&document()).expect("the document serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routes a router file declares: (path, methods).
    fn declared(source: &str) -> Vec<(String, Vec<&'static str>)> {
        let mut out = Vec::new();
        for part in source.split(".route(").skip(1) {
            let Some(path) = part.split('"').nth(1) else { continue };
            if !path.starts_with('/') {
                continue;
            }
            // Up to the end of this route's handlers: the next `.route(`/`.layer(` or blank.
            let call = part.split(".layer(").next().unwrap_or(part);
            let methods = ["get(", "post(", "put(", "delete("]
                .into_iter()
                .filter(|m| call.contains(m))
                .map(|m| m.trim_end_matches('('))
                .collect();
            out.push((path.to_string(), methods));
        }
        out
    }

    #[test]
    fn every_route_served_is_in_the_document_with_its_methods() {
        let doc = serde_json::to_value(document()).unwrap();
        let sources = [
            include_str!("../api.rs"),
            include_str!("../sandbox_routes.rs"),
            include_str!("../openenv.rs"),
            include_str!("../mcp.rs"),
        ];
        let mut seen = 0;
        for source in sources {
            for (path, methods) in declared(source) {
                let item = &doc["paths"][&path];
                assert!(item.is_object(), "{path} is served but not in the document");
                for method in methods {
                    // MCP answers GET and DELETE only to say it has no stream: not an operation.
                    if path.ends_with("/mcp") && method != "post" {
                        continue;
                    }
                    assert!(
                        item[method].is_object(),
                        "{method} {path} is served but not in the document"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen > 40, "only {seen} operations were found in the routers");
    }

    #[test]
    fn every_schema_referred_to_is_defined() {
        let doc = serde_json::to_value(document()).unwrap();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("#/components/schemas/").skip(1) {
            let name: String = part.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            assert!(schemas.contains_key(&name), "{name} is referred to but not defined");
        }
        // The types' own fields: a field added to a type is in its schema.
        let sandbox = &schemas["SandboxView"]["properties"];
        assert!(
            sandbox["expires_at_ms"].is_object() && sandbox["metadata"].is_object(),
            "{sandbox}"
        );
        assert!(schemas["SandboxRequest"]["properties"]["disk_mib"].is_object());
    }

    /// `docs/openapi.json` is the document: the SDK's models are checked against that file.
    #[test]
    fn the_committed_document_is_the_generated_one() {
        let committed = include_str!("../../../../docs/openapi.json");
        assert!(
            committed.trim_end() == json(),
            "docs/openapi.json differs from the types: run `cargo run -p farm -- openapi > docs/openapi.json`"
        );
    }
}
