//! Strict JSON: every body on every front door is read by [`parse`] once, into its typed
//! request. One JSON value and nothing after it (whitespace aside), no key twice in any
//! object at any depth: what two readers could take differently is refused, so that a check
//! and the work it guards never see two different requests.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};

/// Why a body is not a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadJson {
    /// Where in the body (`a.b[2]`), when it is inside a value.
    pub path: Option<String>,
    pub message: String,
}

impl fmt::Display for BadJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// `bytes` as one `T`: strict (see the module's doc), with the path of what is wrong.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BadJson> {
    read::<Unique>(bytes)?;
    read::<T>(bytes)
}

/// A request's JSON body, strictly, or a 400 naming the field that is wrong.
pub fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, service::ApiError> {
    parse(bytes).map_err(|e| service::ApiError {
        field: e.path,
        ..service::ApiError::new(service::ErrorKind::Invalid, format!("bad request body: {}", e.message))
    })
}

fn read<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BadJson> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        BadJson {
            path: (path != ".").then_some(path),
            message: e.into_inner().to_string(),
        }
    })?;
    de.end().map_err(|e| BadJson {
        path: None,
        message: format!(
            "bytes after the JSON value at line {} column {} (a body is one JSON value)",
            e.line(),
            e.column()
        ),
    })?;
    Ok(value)
}

/// Any JSON value, refused when an object at any depth has a key twice.
struct Unique;

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_none<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Unique, D::Error> {
        serde::Deserialize::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!(
                    "the key {key:?} is given twice (each key at most once)"
                )));
            }
            map.next_value::<Unique>()?;
        }
        Ok(Unique)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Request {
        environment: String,
        #[serde(default)]
        env: std::collections::BTreeMap<String, String>,
        #[serde(default)]
        inner: Option<Box<Request>>,
    }

    #[test]
    fn one_value_and_nothing_after_it() {
        let good: Request = parse(b" {\"environment\": \"e\"} \n").unwrap();
        assert_eq!(good.environment, "e");
        for tail in [" x", "\n{}", " 1", "{\"environment\":\"f\"}", "\u{0}"] {
            let body = format!("{{\"environment\": \"e\"}}{tail}");
            let e = parse::<Request>(body.as_bytes()).unwrap_err();
            assert!(e.message.contains("after the JSON value"), "{tail:?}: {e}");
        }
    }

    #[test]
    fn a_key_given_twice_is_refused_at_any_depth() {
        for (body, path) in [
            (r#"{"environment":"a","environment":"b"}"#, None),
            (r#"{"environment":"a","env":{"K":"1","K":"2"}}"#, Some("env")),
            (
                r#"{"environment":"a","inner":{"environment":"x","env":{"A":"1","A":"1"}}}"#,
                Some("inner.env"),
            ),
            (r#"[{"a":1},{"b":1,"b":2}]"#, Some("[1]")),
        ] {
            let e = parse::<serde_json::Value>(body.as_bytes()).unwrap_err();
            assert!(e.message.contains("given twice"), "{body}: {e}");
            assert_eq!(e.path.as_deref(), path, "{body}");
        }
        // The same key in two objects is two keys.
        parse::<Request>(br#"{"environment":"a","inner":{"environment":"b"}}"#).unwrap();
    }

    #[test]
    fn a_wrong_field_is_named() {
        let e = parse::<Request>(br#"{"environment": 3}"#).unwrap_err();
        assert_eq!(e.path.as_deref(), Some("environment"));
        let e = parse::<Request>(b"{\"environment\": \"a\"").unwrap_err();
        assert!(e.message.contains("EOF"), "{e}");
    }
}
