//! The middleware every route runs behind ([`layer`]): who calls, and what the call may see
//! and touch of the tenants' ids, sizes and quotas. Tenants themselves (keys, owners, quotas,
//! connections) are the `service` crate's (`service::tenancy`).

mod scope;
mod views;

pub(super) use scope::{layer, Hidden, Parsed};
pub use service::tenancy::*;
