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

use service::wire::*;

mod routes;
mod routes_hosting;

/// What a route takes or gives.
pub(super) enum Body {
    /// JSON of a wire type's schema.
    Json(Box<Content>),
    /// Bytes of a media type (a tar archive, a file, a stream of events).
    Raw(&'static str),
}

/// The document being made: its paths, and the schemas they refer to.
pub(super) struct Doc {
    paths: PathsBuilder,
    schemas: Vec<(String, RefOr<Schema>)>,
}

impl Doc {
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
    pub(super) fn route(
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

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = Doc {
        paths: PathsBuilder::new(),
        schemas: Vec::new(),
    };
    doc.json::<ErrorBody>();
    use routes::*;
    use routes_hosting::*;
    rollout_routes(&mut doc);
    session_routes(&mut doc);
    session_state_routes(&mut doc);
    environment_routes(&mut doc);
    sandbox_routes(&mut doc);
    sandbox_state_routes(&mut doc);
    sandbox_network_routes(&mut doc);
    file_routes(&mut doc);
    process_routes(&mut doc);
    process_output_routes(&mut doc);
    terminal_routes(&mut doc);
    port_routes(&mut doc);
    protocol_routes(&mut doc);
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
        .paths(doc.paths.build())
        .components(Some(ComponentsBuilder::new().schemas_from_iter(doc.schemas).build()))
        .build()
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
            include_str!("../hosting_routes.rs"),
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
