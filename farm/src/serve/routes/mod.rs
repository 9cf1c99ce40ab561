//! Every route of `farm serve`, declared once: its method, path and handler, which request type
//! it takes and which answer type it gives ([`table`], [`hosting`]). The one declaration makes
//! both the router and the OpenAPI 3.1 document, so no route is served undocumented or
//! documented unserved. Schemas are the wire types' own (`utoipa::ToSchema`), so a field added
//! to a type is in the document; `docs/openapi.json` is the document as committed, and the
//! SDK's models are checked against it.

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem, PathsBuilder};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ComponentsBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{Content, InfoBuilder, OpenApiBuilder, Ref, RefOr, Required};
use utoipa::ToSchema;

use service::wire::*;

mod e2b;
mod events;
mod hosting;
mod table;

use axum::handler::Handler;
use axum::routing::{on, MethodFilter};
use axum::Router;

use super::http::App;

/// What a route takes or gives.
pub(super) enum Body {
    /// JSON of a wire type's schema.
    Json(Box<Content>),
    /// Bytes of a media type (a tar archive, a file, a stream of events).
    Raw(&'static str),
}

/// The routes being declared: the router they make, and the document's paths and the schemas
/// they refer to.
pub(super) struct Routes {
    router: Router<App>,
    paths: PathsBuilder,
    schemas: Vec<(String, RefOr<Schema>)>,
}

impl Routes {
    fn new() -> Routes {
        Routes {
            router: Router::new(),
            paths: PathsBuilder::new(),
            schemas: Vec::new(),
        }
    }

    /// `method path` served by `handler`, documented by the rest (see [`Routes::doc`]).
    #[allow(clippy::too_many_arguments)] // one route's whole declaration, read as one line
    pub(super) fn add<H: Handler<T, App>, T: 'static>(
        &mut self,
        method: HttpMethod,
        path: &str,
        handler: H,
        summary: &str,
        query: &[(&str, &str)],
        request: Option<Body>,
        answers: Vec<(&str, &str, Body)>,
    ) {
        self.serve(method.clone(), path, handler);
        self.doc(method, path, summary, query, request, answers);
    }

    /// `method path` served by `handler` and left out of the document (a refusal that says
    /// where to go instead).
    pub(super) fn undocumented<H: Handler<T, App>, T: 'static>(&mut self, method: HttpMethod, path: &str, handler: H) {
        self.serve(method, path, handler);
    }

    fn serve<H: Handler<T, App>, T: 'static>(&mut self, method: HttpMethod, path: &str, handler: H) {
        let filter = match method {
            HttpMethod::Get => MethodFilter::GET,
            HttpMethod::Post => MethodFilter::POST,
            HttpMethod::Put => MethodFilter::PUT,
            HttpMethod::Delete => MethodFilter::DELETE,
            _ => unreachable!("farm serve declares GET, POST, PUT and DELETE only"),
        };
        let router = std::mem::take(&mut self.router);
        self.router = router.route(path, on(filter, handler));
    }

    /// The routes `declare` adds, their request bodies at most `limit` bytes.
    fn group(&mut self, limit: usize, declare: impl FnOnce(&mut Routes)) {
        let mut group = Routes::new();
        declare(&mut group);
        let router = std::mem::take(&mut self.router);
        let limited = group.router.layer(axum::extract::DefaultBodyLimit::max(limit));
        self.router = router.merge(limited);
        for (path, item) in group.paths.build().paths {
            self.paths = std::mem::take(&mut self.paths).path(path, item);
        }
        self.schemas.extend(group.schemas);
    }

    /// JSON of `T`, its schema (and the ones it refers to) added to the components.
    pub(super) fn json<T: ToSchema>(&mut self) -> Body {
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
    fn doc(
        &mut self,
        method: HttpMethod,
        path: &str,
        summary: &str,
        query: &[(&str, &str)],
        request: Option<Body>,
        answers: Vec<(&str, &str, Body)>,
    ) {
        let mut operation = OperationBuilder::new().summary(Some(summary));
        for name in path
            .split('{')
            .skip(1)
            .filter_map(|part| part.split_once('}').map(|(name, _)| name))
        {
            operation = operation.parameter(
                ParameterBuilder::new()
                    .name(name)
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

/// Every route, declared.
fn declare() -> Routes {
    use table::*;
    let mut routes = Routes::new();
    routes.json::<ErrorBody>();
    routes.group(16 << 20, |r| {
        rollout_routes(r);
        session_routes(r);
        session_state_routes(r);
        environment_routes(r);
        sandbox_routes(r);
        sandbox_state_routes(r);
        sandbox_lifetime_routes(r);
        sandbox_network_routes(r);
        events::event_routes(r);
        events::workspace_routes(r);
    });
    routes.group(service::sandbox::MAX_CONTEXT_BYTES as usize, context_routes);
    let file = super::sandbox_routes::MAX_FOLDER_UPLOAD.max(service::sandbox::sandboxes::MAX_FILE_BYTES as usize);
    routes.group(file, file_routes);
    routes.group(4 << 20, |r| {
        hosting::process_routes(r);
        hosting::process_output_routes(r);
        hosting::terminal_routes(r);
        hosting::port_routes(r);
    });
    protocol_routes(&mut routes);
    routes.group(file, e2b::e2b_routes);
    routes
}

/// Every route of `farm serve`, behind the tenancy layer; anything else is a 404 that says
/// where the routes are.
pub(super) fn router(service: std::sync::Arc<service::state::Service>) -> Router {
    use super::error::{ApiError, HttpError};
    let app = App { service };
    declare()
        .router
        .fallback(|| async {
            HttpError::from(ApiError::new(
                service::ErrorKind::NotFound,
                "no such endpoint (see docs/serve.md and docs/sandbox-api.md)",
            ))
        })
        .layer(axum::middleware::from_fn_with_state(
            app.service.clone(),
            super::tenancy::layer,
        ))
        .layer(axum::middleware::from_fn(super::e2b::errors))
        .layer(axum::Extension(std::sync::Arc::new(
            super::e2b::watch::Watchers::default(),
        )))
        .layer(axum::middleware::from_fn(super::unread::close_unread))
        .with_state(app)
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    let routes = declare();
    let info = InfoBuilder::new()
        .title("farm serve")
        .version("1")
        .description(Some(
            "Rollouts and their rows, live sessions, and the sandbox API (environments and sandboxes). \
             See docs/serve.md (rollouts and sessions) and docs/sandbox-api.md.",
        ))
        .build();
    OpenApiBuilder::new()
        .info(info)
        .paths(routes.paths.build())
        .components(Some(ComponentsBuilder::new().schemas_from_iter(routes.schemas).build()))
        .build()
}

/// `GET /v1/openapi.json`.
pub(super) async fn document_route() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(document())
}

/// The document as pretty JSON text (what `farm openapi` prints, and `docs/openapi.json`).
pub fn json() -> String {
    serde_json::to_string_pretty(&document()).expect("the document serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routes are served only as declared: no transport file adds one of its own, and the
    /// declaration makes a router (axum refuses a method declared twice on a path).
    #[test]
    fn every_route_is_served_from_its_declaration() {
        let sources = [
            ("api.rs", include_str!("../api.rs")),
            ("sandbox_routes.rs", include_str!("../sandbox_routes.rs")),
            ("hosting_routes.rs", include_str!("../hosting_routes.rs")),
            ("openenv.rs", include_str!("../openenv.rs")),
            ("mcp.rs", include_str!("../mcp.rs")),
            ("pty.rs", include_str!("../pty.rs")),
            ("http.rs", include_str!("../http.rs")),
            ("tenancy.rs", include_str!("../tenancy.rs")),
        ];
        for (name, source) in sources {
            assert!(!source.contains(".route("), "{name} serves a route outside routes/");
        }
        let _ = declare().router;
        let doc = serde_json::to_value(document()).unwrap();
        let operations: usize = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .map(|item| item.as_object().unwrap().len())
            .sum();
        assert!(operations > 50, "only {operations} operations are declared");
        // MCP's GET and DELETE are served (to say there is no stream) and not operations.
        let mcp = doc["paths"]["/v1/sessions/{id}/mcp"].as_object().unwrap();
        assert_eq!(mcp.keys().collect::<Vec<_>>(), ["post"]);
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
