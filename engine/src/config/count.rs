//! Numbers farm may choose from the host.

use serde::{Deserialize, Serialize};

/// A number farm may choose from the host (`"auto"`) or that the suite fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Count {
    #[default]
    Auto,
    Fixed(usize),
}

impl Serialize for Count {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Count::Auto => serializer.serialize_str("auto"),
            Count::Fixed(n) => serializer.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Count, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number >= 0, or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Count, E> {
                usize::try_from(v)
                    .map(Count::Fixed)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Count, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("expected a whole number >= 0, or \"auto\", got {v}")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Count, E> {
                if v == "auto" {
                    Ok(Count::Auto)
                } else {
                    Err(E::custom(format!(
                        "expected a whole number >= 0, or \"auto\", got {v:?}"
                    )))
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}
