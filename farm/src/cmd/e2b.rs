//! `farm e2b env`: the settings with which E2B's SDK reaches a `farm serve`, as `export`
//! lines, so `eval "$(farm e2b env --key KEY)"` is a client's whole set-up.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum E2bCommand {
    /// Print `export` lines of E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY for this service.
    Env(EnvArgs),
}

#[derive(Args)]
pub struct EnvArgs {
    /// A tenant's key (`farm_...`, from `farm tenant key add`); default: $FARM_SERVE_TOKEN.
    #[arg(long)]
    key: Option<String>,
    /// The service's address; default: $FARM_URL, else http://127.0.0.1:8765.
    #[arg(long)]
    url: Option<String>,
}

pub fn run(command: E2bCommand) -> Result<i32> {
    let E2bCommand::Env(args) = command;
    let key = match args.key.or_else(|| std::env::var("FARM_SERVE_TOKEN").ok()) {
        Some(key) => key,
        None => bail!("--key: a tenant's key (farm_...) is required, as FARM_SERVE_TOKEN is unset"),
    };
    let url = args
        .url
        .or_else(|| std::env::var("FARM_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:8765".into());
    for line in exports(&url, &key)? {
        crate::ui::outln!("{line}");
    }
    Ok(0)
}

/// The lines: one URL for the REST API and every sandbox (routed by E2B's headers), and the
/// key in the shape E2B's SDK accepts (`e2b_` and the key's hex).
fn exports(url: &str, key: &str) -> Result<Vec<String>> {
    let url = url.trim_end_matches('/');
    let host = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or("");
    if host.is_empty() || host.contains('/') {
        bail!("--url {url:?}: the service's address with no path, as http://HOST:PORT");
    }
    let Some(hex) = key.strip_prefix(tenants::KEY_PREFIX) else {
        bail!(
            "--key: a tenant's key starts with {} (E2B's SDK is given e2b_ and its hex)",
            tenants::KEY_PREFIX
        );
    };
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("--key: {}HEX, as `farm tenant key add` prints it", tenants::KEY_PREFIX);
    }
    Ok(vec![
        format!("export E2B_API_URL={url}"),
        format!("export E2B_SANDBOX_URL={url}"),
        format!("export E2B_API_KEY=e2b_{hex}"),
    ])
}

#[cfg(test)]
mod tests {
    use super::exports;

    #[test]
    fn the_settings_are_one_url_and_an_e2b_shaped_key() {
        assert_eq!(
            exports("http://127.0.0.1:8765/", "farm_00ff").unwrap(),
            vec![
                "export E2B_API_URL=http://127.0.0.1:8765",
                "export E2B_SANDBOX_URL=http://127.0.0.1:8765",
                "export E2B_API_KEY=e2b_00ff",
            ]
        );
        for (url, key) in [
            ("127.0.0.1:8765", "farm_00"),
            ("http://h:1/api", "farm_00"),
            ("http://h:1", "e2b_00"),
            ("http://h:1", "farm_xyz"),
            ("http://", "farm_00"),
        ] {
            assert!(exports(url, key).is_err(), "{url} {key}");
        }
    }
}
